// attnlab: the block-sparse forward (FlexAttention's forward) on the Hopper
// engine of rung 12 — the host API. Kernel and tile table:
// kernels/blocksparse/blocksparse_fwd.cu; the idea: docs/blocksparse.md.
//
//   O = softmax(mask(score_mod(scale · Q·Kᵀ))) · V, LSE fp32 (natural log)
//   Q [B, H, Nq, D], K [B, Hkv, Nk, D], V [B, Hkv, Nk, Dv], O [B, H, Nq, Dv]
//
// Only the key blocks the block mask lists for a query block are visited: the
// mask_mod runs on the partial ones, the score_mod on every one, the sequence
// bounds on every one. A query row that sees no key gets O = 0, LSE = -inf.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/mods.h"
#include "host/attn_problem.h"

namespace attnlab {

// Why this problem and block mask cannot run ("" when they can): the device
// (sm_90a, TMA), the head dims, the grouping of heads, the block mask's shape
// (the problem's Nq and Nk; B and H the problem's or 1, broadcast), block sizes
// that are not multiples of the kernel's tile, p.causal (a causal mask is the
// `causal` mask_mod here).
std::string blocksparse_fwd_unsupported(const AttnProblem& p, const BlockMaskView& bm);

// The kernel's tile for head dims D, Dv in *Br x *Bc, which a block size must
// be a multiple of; "" then, else why no kernel has these head dims. Needs no
// GPU: the harness checks --block-size with it before it looks for one.
std::string blocksparse_fwd_tile(int D, int Dv, int* Br, int* Bc);

// The workspace blocksparse_fwd takes (b.workspace): its persistent grid's
// item counter, 16 bytes. With less, the grid has one block per query tile.
size_t blocksparse_fwd_workspace_bytes();

// O and LSE into b.o, b.lse (b.workspace: see above). The block mask's lists
// must be valid for the problem (block_mask_invalid); `mask` must be the
// mask_mod it was built from (its document ids in device memory), since the
// partial blocks evaluate it. Asynchronous on `stream`.
cudaError_t blocksparse_fwd(const AttnProblem& p, const AttnBuffers& b, const BlockMaskView& bm, const MaskMod& mask,
                            const ScoreMod& score, cudaStream_t stream);

// One line per head-dim config: the tile, warps, shared memory, ping-pong.
std::string blocksparse_fwd_describe();

}  // namespace attnlab
