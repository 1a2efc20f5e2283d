// ============================================================================
// Block-sparse forward — FlexAttention's forward on rung 12's engine
// ============================================================================
// What changes against rung 12 (`ws+stage2+pingpong`): the same producer warpgroup, TMA ring
// and ping-pong compute warpgroups with P in registers (hopper/fwd_mainloop.cuh), but
//   NEW (walk, fwd_mainloop.cuh): a query tile visits only the key blocks its
//        query block lists, partial list then full list, each from the largest
//        block down (flash_attn/cute's block_sparse_utils.py), each block cut into
//        block_kv / Bc key tiles (kv subtiling). Producer and consumers walk the
//        same lists, so they agree on the count, 0 included: O = 0, LSE = -inf;
//   NEW (mods, apply_mods.cuh): per tile, score_mod(scale·s) when there is one
//        (a bias broadcast over the queries loaded before the tile's score MMA),
//        the mask_mod on partial tiles only, the sequence bounds on every tile;
//   NEW (order, fwd_scheduler.cuh): the (query tile, head) items in rung 12's
//        causal order (bottom tiles first), taken from a counter by a persistent
//        grid (rung 12's dynamic order) where a workspace holds it; no stream-K split.
// Where it is slower than rung 12 on the same keys: Bc = 128 at D = 128 (176 does
// not divide a 128-key block), an index load per tile, a mod per partial tile.
//
// Per block: Br = 64 x 2 compute warpgroups + 1 producer; sQ [Br, D] once, sK
// [kStages][Bc, D], sV [kStages][Bc, Dv] (Sw128Blocks); 6 + 4·kStages mbarriers.
// Tiles (BsTile, fwd_kernel.cuh; checked below by static_assert): rung 12's, with Br and Bc
// dividing 128 so that FlexAttention's default 128 x 128 blocks map onto tiles:
//   D / Dv     Br   Bc  warpgroups  stages  ping-pong  persistent  smem (+1024 slack)
//   64        128  128   2 + 1       2       yes        no          82040
//   128       128  128   2 + 1       2       yes        yes        163960
//   256       128   64   2 + 1       2       no         yes        196728
//   192 / 128 128  128   2 + 1       2       yes        yes        213112
//   128 / 64  128  128   2 + 1       2       yes        yes        131192
// Block sizes: block_q a multiple of Br, block_kv of Bc (else refused).
// Registers (setmaxnreg): producer / compute 40 / 232.
//
// Supports: fp16, bf16; the (D, Dv) above; GQA/MQA; any Nq, Nk >= 1; every
// mask_mod and score_mod of mods.h; block masks of block_mask.h, B and H
// broadcast. Writes O and LSE. Needs sm_90a, cuTensorMapEncodeTiled.
//
// Run: build/test_blocksparse_fwd   (tests/gpu/test_blocksparse_fwd.cpp)
// ============================================================================

#include "blocksparse/blocksparse_fwd.h"

#include <string>

#include "blocksparse/fwd_kernel.cuh"
#include "host/device.h"

namespace attnlab {
namespace {

using namespace bs_fwd;

// The header's table.
template <int D, int Dv, int kBr, int kBc, int kThreads, bool kPingpong, bool kPersistent, int kSmem>
constexpr bool kTableRow = Config<D, Dv>::kBr == kBr && Config<D, Dv>::kBc == kBc &&
                           Config<D, Dv>::kThreads == kThreads && Config<D, Dv>::kStages == 2 &&
                           BsTile<D, Dv>::kPingpong == kPingpong && BsTile<D, Dv>::kPersistent == kPersistent &&
                           Config<D, Dv>::kSmemBytes - 1024 == kSmem;
static_assert(kTableRow<64, 64, 128, 128, 384, true, false, 82040>, "header: D=64");
static_assert(kTableRow<128, 128, 128, 128, 384, true, true, 163960>, "header: D=128");
static_assert(kTableRow<256, 256, 128, 64, 384, false, true, 196728>, "header: D=256");
static_assert(kTableRow<192, 128, 128, 128, 384, true, true, 213112>, "header: D=192, Dv=128");
static_assert(kTableRow<128, 64, 128, 128, 384, true, true, 131192>, "header: D=128, Dv=64");
static_assert(WsWarps<kBsWarpgroups>::kProducerRegs == 40 && WsWarps<kBsWarpgroups>::kComputeRegs == 232,
              "header: 40 / 232 after setmaxnreg");
static_assert(128 % Config<64, 64>::kBr == 0 && 128 % Config<128, 128>::kBc == 0 && 128 % Config<256, 256>::kBc == 0,
              "FlexAttention's default 128 x 128 blocks are whole tiles");

using BsHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<256, 256>, HeadDims<192, 128>,
                               HeadDims<128, 64>>;

}  // namespace

std::string blocksparse_fwd_unsupported(const AttnProblem& p, const BlockMaskView& bm) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  int smem = 0, Br = 0, Bc = 0;
  if (!BsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
        using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
        smem = Cfg::kSmemBytes, Br = Cfg::kBr, Bc = Cfg::kBc;
      }))
    return BsHeadDims::not_in(p.D, p.Dv);
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  if (!bm.kv_count || !bm.kv_index || !bm.full_count || !bm.full_index) return "block mask without forward lists";
  if (std::string why = block_mask_view_unsupported(p, bm, Br, Bc); !why.empty()) return why;
  if (make_tile_order(p, Br, kBlockSparsePolicy).items == 0) return "more than 2^30 query tiles";
  return smem_unsupported(size_t(smem));
}

std::string blocksparse_fwd_tile(int D, int Dv, int* Br, int* Bc) {
  if (BsHeadDims::dispatch(D, Dv, [&](auto dims) {
        using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
        *Br = Cfg::kBr, *Bc = Cfg::kBc;
      }))
    return "";
  return BsHeadDims::not_in(D, Dv);
}

size_t blocksparse_fwd_workspace_bytes() { return kDynamicCounterBytes; }

cudaError_t blocksparse_fwd(const AttnProblem& p, const AttnBuffers& b, const BlockMaskView& bm, const MaskMod& mask,
                            const ScoreMod& score, cudaStream_t stream) {
  if (!blocksparse_fwd_unsupported(p, bm).empty() || !mods_unfit(p, mask, score).empty())
    return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  BsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    err = blocksparse_fwd_dims<decltype(dims)::D, decltype(dims)::Dv>(p, b, bm, mask, score, stream);
  });
  return err;
}

std::string blocksparse_fwd_describe() {
  std::string s = "sm_90a wgmma, K/V by TMA from a producer warpgroup, listed key tiles only; stages=" +
                  std::to_string(kBsStages);
  BsHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    s += "; D=" + std::to_string(D) + (Dv == D ? "" : "/" + std::to_string(Dv)) + ": Br=" + std::to_string(Cfg::kBr) +
         " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) +
         " smem=" + std::to_string(Cfg::kSmemBytes) + "B" + (BsTile<D, Dv>::kPingpong ? " pingpong" : "");
  });
  return s + "; fp16/bf16; GQA/MQA; any Nq, Nk; block sizes multiples of Br x Bc; a persistent grid taking the "
             "items from a counter";
}

}  // namespace attnlab
