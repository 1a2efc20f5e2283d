// attnlab: the block-sparse backward (FlexAttention's backward) on the Hopper
// engine of rung 14 — the host API. Kernel and tile table:
// kernels/blocksparse/blocksparse_bwd.cu; the idea: docs/blocksparse.md.
//
//   O = softmax(mask(score_mod(scale · Q·Kᵀ))) · V (the block-sparse forward's),
//   given O, LSE (natural log, as blocksparse_fwd writes it) and dO:
//   dQ [B, H, Nq, D], dK [B, Hkv, Nk, D], dV [B, Hkv, Nk, Dv]
//
// Each key tile visits only the query blocks the block mask's transposed lists
// name for its key block: the mask_mod runs on the partial ones, the score_mod
// (and its derivative) on every one, the sequence bounds on every one. A key
// tile that no query block sees gets dK = dV = 0; a query row that sees no key
// (LSE = -inf) gets dQ = 0.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/mods.h"
#include "host/attn_problem.h"

namespace attnlab {

// Why this problem and block mask cannot run ("" when they can): the device
// (sm_90a, TMA), the head dims (64, 128, 192/128, 256), the grouping
// of heads and the grid's limits, the block mask's shape (the problem's Nq
// and Nk; B and H the problem's or 1, broadcast; both the forward and the
// transposed lists), block sizes that are not multiples of the kernel's tile,
// p.causal (a causal mask is the `causal` mask_mod here).
std::string blocksparse_bwd_unsupported(const AttnProblem& p, const BlockMaskView& bm);

// The part of it that needs no block mask: the device, the head dims, the
// grouping of heads and the grid's limits (for callers that choose a backward
// before they build a block mask: dmattn's).
std::string blocksparse_bwd_problem_unsupported(const AttnProblem& p);

// The kernel's tile for head dims D, Dv in *Br x *Bc, which a block size must
// be a multiple of; "" then, else why no kernel has these head dims (no GPU needed).
std::string blocksparse_bwd_tile(int D, int Dv, int* Br, int* Bc);

// Bytes of workspace blocksparse_bwd needs in b.workspace (0 when unsupported).
size_t blocksparse_bwd_workspace_bytes(const AttnProblem& p, const BlockMaskView& bm);

// dQ, dK, dV into b.dq, b.dk, b.dv from b.q, b.k, b.v, b.o, b.lse, b.dout,
// with b.workspace (blocksparse_bwd_workspace_bytes of it, 256-byte aligned).
// The block mask's lists must be valid for the problem (block_mask_invalid);
// `mask` and `score` must be the forward's (the mask_mod's document ids in
// device memory). deterministic: bitwise identical gradients run to run (each
// dQ tile takes its key tiles' adds in one fixed order). Asynchronous on `stream`.
cudaError_t blocksparse_bwd(const AttnProblem& p, const AttnGradBuffers& b, const BlockMaskView& bm,
                            const MaskMod& mask, const ScoreMod& score, bool deterministic, cudaStream_t stream);

// One line per head-dim config: the tile, warps, shared memory.
std::string blocksparse_bwd_describe();

}  // namespace attnlab
