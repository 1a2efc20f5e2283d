// ============================================================================
// Block-sparse backward — FlexAttention's backward on rungs 14 and 15's engine
// ============================================================================
// What changes against rung 14 (`bwd-ws`; rung 15's two chains at D = 256):
// the same block per (key tile, KV head) with K_j, V_j, dK_j, dV_j on chip, the
// producer thread and its Q/dO/LSE/Δ ring, the transposed wgmmas, dQ by bulk
// reduce-add (hopper/bwd_mainloop.cuh, hopper/bwd_roles_mainloop.cuh), but
//   NEW (walk, bwd_scheduler.cuh): a key tile visits only the query blocks
//        that its key block's transposed lists name, full list then partial,
//        largest first (flash_attn/cute's flash_bwd_sm100.py), each cut into
//        block_q / Br query tiles; with none it loads nothing, stores dK = dV = 0;
//   NEW (mods, bwd_mods.cuh): P = exp(score_mod(scale·S) − LSE), the mask_mod
//        on partial tiles only, the bounds on every tile; dS times ds'/ds;
//        a bias's dBias = dS' written from the score step (kTensorMods);
//   NEW (turns): `deterministic` adds to a dQ tile in ascending key-tile
//        order, at ranks that a pre-pass finds in the forward lists.
// Where it is slower than rung 14 on the same tiles: a list load per query
// tile, the mods on partial tiles, an lg2 per score under softcap, and in the
// deterministic mode a pre-pass over the lists.
//
// Tiles (BsBwdTile, bwd_kernel.cuh; checked below by static_assert): rung 14's, but for the slice at
// D = 64 (the mods' registers); Bc = 2 x 64 keys.
//   D / Dv     Br  slice  Bc  stages  dQ split  dV early  dSᵀ/dQ bufs  smem (+1024)
//   64        128    64  128   2       rows      no        2 / 1        198696
//   128        64    64  128   2       columns   yes       2 / 2        230440
//   192 / 128  64    32  128   2       columns   no        1 / 1        230440
//   256: rung 15's, Br = 64, Bc = 64 keys (the P and the dS chain), 2 stages, 222248
// Block sizes: block_q a multiple of Br, block_kv of Bc (128; 64 at D = 256).
// Registers (setmaxnreg): producer / compute 24 / 240, rung 14's (the walk's cursors fit).
//
// Supports: fp16, bf16; the (D, Dv) above; GQA/MQA; any Nq, Nk >= 1; every mask_mod
// and score_mod of mods.h; block masks of block_mask.h, B and H broadcast.
// Needs sm_90a, cuTensorMapEncodeTiled.
//
// Run: build/test_blocksparse_bwd   (tests/gpu/test_blocksparse_bwd.cpp)
// ============================================================================

#include "blocksparse/blocksparse_bwd.h"

#include <string>

#include "blocksparse/bwd_kernel.cuh"
#include "host/device.h"
#include "host/launch.h"

namespace attnlab {
namespace {

using namespace bs_bwd;

// The header's table.
static_assert(bwd_ws_table_row<Config<64, 64>>(128, 64, 128, true, false, 2, 1, 198696), "header: D=64");
static_assert(bwd_ws_table_row<Config<128, 128>>(64, 64, 128, false, true, 2, 2, 230440), "header: D=128");
static_assert(bwd_ws_table_row<Config<192, 128>>(64, 32, 128, false, false, 1, 1, 230440), "header: D=192, Dv=128");
static_assert(Config<256, 256>::kBr == 64 && Config<256, 256>::kBc == 64 && Config<256, 256>::kStages == 2 &&
                  Config<256, 256>::kSmemBytes - 1024 == 222248 && kRoles<Config<256, 256>>,
              "header: D=256");
static_assert(kBsBwdStages == 2 && Config<64, 64>::kProducerRegs == 24 && Config<64, 64>::kComputeRegs == 240 &&
                  Config<256, 256>::kProducerRegs == 24 && Config<256, 256>::kComputeRegs == 240,
              "header: two stages, 24 / 240 registers");
static_assert(128 % Config<64, 64>::kBr == 0 && 128 % Config<128, 128>::kBr == 0 &&
                  128 % Config<192, 128>::kBr == 0 && 128 % Config<256, 256>::kBr == 0 &&
                  Config<64, 64>::kBc == 128 && 128 % Config<256, 256>::kBc == 0,
              "FlexAttention's default 128 x 128 blocks are whole tiles");

// The deterministic turns' ranks, one thread per list entry (a pre-pass): for
// entry k of key block n's partial or full list (query block M), the number of
// key blocks below n that M's forward lists (partial and full) name.
__global__ void bs_bwd_ranks_kernel(const int32_t* __restrict__ q_count, const int32_t* __restrict__ q_index,
                                    const int32_t* __restrict__ full_q_count,
                                    const int32_t* __restrict__ full_q_index, const int32_t* __restrict__ kv_count,
                                    const int32_t* __restrict__ kv_index, const int32_t* __restrict__ full_count,
                                    const int32_t* __restrict__ full_index, int32_t* __restrict__ q_rank,
                                    int32_t* __restrict__ full_q_rank, int rows, int m_blocks, int n_blocks) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (list, row = head_row·n_blocks + n, k)
  if (x >= 2 * int64_t(rows) * m_blocks) return;
  const bool full = x >= int64_t(rows) * m_blocks;
  const int at = int(full ? x - int64_t(rows) * m_blocks : x), row = at / m_blocks, k = at % m_blocks;
  if (k >= (full ? full_q_count : q_count)[row]) return;
  const int n = row % n_blocks, head_row = row / n_blocks;
  const int fwd = head_row * m_blocks + (full ? full_q_index : q_index)[at];  // query block M's forward row
  const int64_t fwd_at = int64_t(fwd) * n_blocks;
  (full ? full_q_rank : q_rank)[at] =
      count_below(kv_index + fwd_at, kv_count[fwd], n) + count_below(full_index + fwd_at, full_count[fwd], n);
}

using BsBwdHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<192, 128>, HeadDims<256, 256>>;

// The kernel's tile (Br, Bc) for p's head dims.
void tile_of(const AttnProblem& p, int& Br, int& Bc) {
  Br = Bc = 0;
  BsBwdHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
    Br = Cfg::kBr, Bc = Cfg::kBc;
  });
}

// The workspace: rung 14's (LSE·log2e, Δ, dQ's accumulator, the turns), then
// the deterministic turns' ranks, one per entry of q_index and of full_q_index.
int64_t rank_entries(const BlockMaskView& bm) { return int64_t(bm.B) * bm.H * bm.n_blocks * bm.m_blocks; }
size_t ranks_offset(const AttnProblem& p) { return bwd_ws_workspace_bytes<BsBwdHeadDims, Config>(p); }

cudaError_t launch(const AttnProblem& p, const AttnGradBuffers& b, const BlockMaskView& bm, const MaskMod& mask,
                   const ScoreMod& score, bool deterministic, cudaStream_t stream) {
  int Br, Bc;
  tile_of(p, Br, Bc);
  BlockSparseBwdLists lists;
  lists.q_count = bm.q_count, lists.q_index = bm.q_index;
  lists.full_q_count = bm.full_q_count, lists.full_q_index = bm.full_q_index;
  lists.B = bm.B, lists.H = bm.H, lists.m_blocks = bm.m_blocks, lists.n_blocks = bm.n_blocks;
  lists.q_tiles_per_block = bm.block_q / Br;
  lists.kv_tiles_per_block = bm.block_kv / Bc;
  if (deterministic) {  // NEW (turns): each list entry's rank, before the kernel
    int32_t* ranks = reinterpret_cast<int32_t*>(static_cast<char*>(b.workspace) + ranks_offset(p));
    const int64_t n = rank_entries(bm);
    lists.q_rank = ranks;
    lists.full_q_rank = ranks + n;
    if (cudaError_t e = launch_kernel(bs_bwd_ranks_kernel, dim3(unsigned((2 * n + 255) / 256)), dim3(256), 0, stream,
                                      bm.q_count, bm.q_index, bm.full_q_count, bm.full_q_index, bm.kv_count,
                                      bm.kv_index, bm.full_count, bm.full_index, ranks, ranks + n,
                                      bm.B * bm.H * bm.n_blocks, bm.m_blocks, bm.n_blocks);
        e != cudaSuccess)
      return e;
  }
  cudaError_t err = cudaErrorInvalidValue;
  BsBwdHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    err = blocksparse_bwd_dims<decltype(dims)::D, decltype(dims)::Dv>(p, b, lists, mask, score, deterministic,
                                                                       stream);
  });
  return err;
}

}  // namespace

std::string blocksparse_bwd_problem_unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  return bwd_ws_unsupported<BsBwdHeadDims, Config>(p);
}

std::string blocksparse_bwd_unsupported(const AttnProblem& p, const BlockMaskView& bm) {
  if (std::string why = blocksparse_bwd_problem_unsupported(p); !why.empty()) return why;
  int Br, Bc;
  tile_of(p, Br, Bc);
  if (!bm.q_count || !bm.q_index || !bm.full_q_count || !bm.full_q_index)
    return "block mask without the transposed (backward) lists";
  if (!bm.kv_count || !bm.kv_index || !bm.full_count || !bm.full_index)
    return "block mask without the forward lists (the deterministic turns' ranks come from them)";
  if (std::string why = block_mask_view_unsupported(p, bm, Br, Bc); !why.empty()) return why;
  if (2 * rank_entries(bm) >= (int64_t(1) << 31)) return "block mask of 2^30 list entries or more";
  return "";
}

std::string blocksparse_bwd_tile(int D, int Dv, int* Br, int* Bc) {
  AttnProblem p;
  p.D = D, p.Dv = Dv;
  tile_of(p, *Br, *Bc);
  if (*Br > 0) return "";
  return BsBwdHeadDims::not_in(D, Dv);
}

size_t blocksparse_bwd_workspace_bytes(const AttnProblem& p, const BlockMaskView& bm) {
  if (!blocksparse_bwd_unsupported(p, bm).empty()) return 0;
  return ranks_offset(p) + bwd_align256(size_t(2 * rank_entries(bm)) * 4);
}

cudaError_t blocksparse_bwd(const AttnProblem& p, const AttnGradBuffers& b, const BlockMaskView& bm,
                            const MaskMod& mask, const ScoreMod& score, bool deterministic, cudaStream_t stream) {
  if (!blocksparse_bwd_unsupported(p, bm).empty() || !mods_unfit(p, mask, score).empty() ||
      b.workspace == nullptr ||
      b.workspace_bytes < blocksparse_bwd_workspace_bytes(p, bm))
    return cudaErrorInvalidValue;
  return launch(p, b, bm, mask, score, deterministic, stream);
}

std::string blocksparse_bwd_describe() {
  std::string s = "sm_90a wgmma, rung 14's engine (rung 15's two chains at D = 256; dQ by bulk reduce-add), listed "
                  "query tiles only; "
                  "stages=" + std::to_string(kBsBwdStages);
  BsBwdHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    s += "; D=" + std::to_string(D) + (Dv == D ? "" : "/" + std::to_string(Dv)) + ": Br=" + std::to_string(Cfg::kBr) +
         " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) +
         " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
  });
  return s + "; fp16/bf16; GQA/MQA; any Nq, Nk; block sizes multiples of Br x Bc; deterministic or not";
}

}  // namespace attnlab
