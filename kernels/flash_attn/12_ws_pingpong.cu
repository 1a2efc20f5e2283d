// ============================================================================
// Rung 12 — rung 07's overlap, fed by TMA from a producer warpgroup, with the
//           compute warpgroups taking turns on the tensor cores (ping-pong)
// ============================================================================
// What changes against rung 07 (`wgmma+stage2+overlap`): the math per tile is
// the same (S = Q·K_jᵀ issued, then P_{j-1}·V_{j-1}; the softmax of S_j runs
// while that P·V does), but
//   NEW (ws): the copies leave the compute threads, and with them rung 07's
//        __syncthreads per tile. A producer warpgroup (rung 09's split,
//        setmaxnreg) issues each tile as TMA boxes into a ring of
//        kStages slots with a full/empty mbarrier pair per slot;
//   NEW (+pingpong): the warpgroups take turns: one issues its tile's MMAs only
//        after the previous one has issued its own, and passes the turn on
//        right after, so while one does its softmax the other's MMAs keep the
//        tensor cores busy. A named barrier per warpgroup carries the turn
//        (FlashAttention-3, §3.1). A ready warpgroup may wait for its turn;
//   NEW (tile order, hopper/fwd_scheduler.h): non-causal, a persistent grid (one block
//        per SM walks its share of the tiles, the next tile's Q and K loading
//        under this one's epilogue), the last round's tiles split along the keys
//        over all blocks (stream-K, common/kv_split.cuh merges the parts);
//        causal, longest first from an atomic counter. The engine: kernels/hopper/fwd_*.
//
// Per block: Br = 64 x W compute warpgroups + 1 producer; sQ [Br, D] once, sK
// [kStages][Bc, D], sV [kStages][Bc, Dv] (Sw128Blocks); 6 + 4·kStages mbarriers.
// Tiles (WsTile, hopper/fwd_tile.h, checked here by static_assert): FlashAttention-3's per head
// dim (hopper/tile_size.h), 3 warpgroups at D = 64; ping-pong where FA3 uses it
// and it measures faster (not at D = 256, where MMAs outweigh the softmax):
//   D / Dv     Br   Bc  warpgroups  stages  ping-pong  smem (+1024 alignment slack)
//   64        192  128   3 + 1       2       yes        90232
//   128       128  176   2 + 1       2       yes       213112
//   256       128   80   2 + 1       2       no        229496
//   192 / 128 128  128   2 + 1       2       yes       213112
//   128 / 64  128  128   2 + 1       2       yes       131192
// Registers (setmaxnreg): producer / compute 40 / 232 (2 + 1), 32 / 160 (3 + 1).
//
// Supports: fp16, bf16; the (D, Dv) above; GQA/MQA; any Nq, Nk >= 1; causal
// (bottom-right) or not; O and LSE. Needs sm_90, sm_90a, cuTensorMapEncodeTiled.
// Steps, each one idea, named on request: ws+tma (+pingpong, +persistent).
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 128 --variant 'ws*,wgmma+stage2+overlap' --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "hopper/fwd_epilogue.cuh"
#include "hopper/fwd_kernel.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "hopper/fwd_scheduler.h"
#include "hopper/fwd_tile.h"
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {

namespace {

// The tile per (D, Dv), WsTile, and the rings' kWsStages: hopper/fwd_tile.h,
// shared with the variable-length forward. WsWarps and WsConfig (the register
// split and the tile config the mainloop takes): hopper/fwd_mainloop.cuh.
static_assert(kWsStages == 2, "header: two slots in each of the K and V rings");
template <int D, int Dv>
using Config = WsEngineConfig<D, Dv>;

// The header's table.
template <int D, int Dv, int kBr, int kBc, int kThreads, bool kPingpong, int kSmem>
constexpr bool kTableRow = Config<D, Dv>::kBr == kBr && Config<D, Dv>::kBc == kBc &&
                           Config<D, Dv>::kThreads == kThreads && WsTile<D, Dv>::kPingpong == kPingpong &&
                           Config<D, Dv>::kSmemBytes - 1024 == kSmem;
static_assert(kTableRow<64, 64, 192, 128, 512, true, 90232>, "header: D=64");
static_assert(kTableRow<128, 128, 128, 176, 384, true, 213112>, "header: D=128");
static_assert(kTableRow<256, 256, 128, 80, 384, false, 229496>, "header: D=256");
static_assert(kTableRow<192, 128, 128, 128, 384, true, 213112>, "header: D=192, Dv=128");
static_assert(kTableRow<128, 64, 128, 128, 384, true, 131192>, "header: D=128, Dv=64");
static_assert(WsWarps<2>::kLaunchRegs == 168 && WsWarps<2>::kProducerRegs == 40 && WsWarps<2>::kComputeRegs == 232,
              "header: 168 registers at launch, 40 / 232 after setmaxnreg");
static_assert(WsWarps<3>::kProducerRegs == 32 && WsWarps<3>::kComputeRegs == 160, "header: 32 / 160 for 3 + 1");

template <typename Cfg, typename T, bool kPingpong>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
ws_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
          const __grid_constant__ CUtensorMap tma_v, T* __restrict__ o, float* __restrict__ lse,
          const AttnProblem p, const TileOrder order, const KvSplitArgs split, int* __restrict__ counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The block's work pieces, as order.piece(...) deals them: one item (a grid
  // of one block per item), or one piece per round of a persistent grid; under
  // a dynamic order the producer takes them from `counter` (hopper/fwd_kernel.cuh).
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ws_fwd_block<Cfg, T>(
      smem_raw, order, counter, &tma_q, &tma_k, &tma_v,
      [&](const WsShared<Cfg, T>& sm, const WorkPiece& piece, WsRing& ring) __attribute__((always_inline)) {
        ws_load<Cfg, T>(sm, &tma_q, &tma_k, &tma_v, ws_work<Cfg>(p, order, piece), ring);
      },
      [&](const WsShared<Cfg, T>& sm, const WorkPiece& piece, WsRing& ring) __attribute__((always_inline)) {
        const WsWork w = ws_work<Cfg>(p, order, piece);
        float O[Cfg::kTilesO][4] = {};
        RowStats stats;
        ws_compute<Cfg, T, kPingpong>(sm, p, w, ring, O, stats);
        ws_epilogue<Cfg, T>(O, stats, p, order, w, split, o, lse);
      });
#endif
}

// ---- host --------------------------------------------------------------------------

using WsHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<256, 256>, HeadDims<192, 128>,
                               HeadDims<128, 64>>;

// The tile scheduler's policy (hopper/fwd_scheduler.h): equal items head by
// head, the last round split along the keys; causal items longest first.
FwdPolicy policy(const AttnProblem& p) { return p.causal ? FwdPolicy::kLongestFirst : FwdPolicy::kHeadByHead; }
template <typename Cfg>
constexpr FwdTiles kFwdTiles{Cfg::kBr, Cfg::kBc, Cfg::kComputeWarps * 32, Cfg::kTilesO};

std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  int smem = 0, Br = 0;
  if (!WsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
        using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
        smem = Cfg::kSmemBytes;
        Br = Cfg::kBr;
      }))
    return WsHeadDims::not_in(p.D, p.Dv);
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  if (make_tile_order(p, Br, policy(p)).items == 0) return "more than 2^30 query tiles";
  return smem_unsupported(size_t(smem));
}

// The steps page 12 measures one idea at a time, each a variant of its own
// (named on request, not in the default set: VariantOf::on_request), the
// engine last:
//   kBlockPerTile: TMA producer and K/V ring alone: a block per query tile,
//     head by head, no persistence (rung 07 plus the producer);
//   kPersistent: one block per SM walking its tiles: causal, longest first
//     from the counter (the dynamic order); non-causal, dealt round-robin,
//     the last round whole;
//   kEngine: non-causal, the last round split along the keys (stream-K).
enum class WsStep { kBlockPerTile, kPersistent, kEngine };

// What a step's schedule takes: its policy, whether its grid is persistent,
// and whether it is given the workspace (the counter, or the split's parts).
struct StepPlan {
  FwdPolicy policy;
  bool persistent, workspace;
};
template <WsStep kStep>
StepPlan step_plan(const AttnProblem& p) {
  switch (kStep) {
    case WsStep::kBlockPerTile: return {FwdPolicy::kHeadByHead, false, false};
    case WsStep::kPersistent:   return {policy(p), true, p.causal};
    case WsStep::kEngine:       return {policy(p), true, true};
  }
  return {};
}

// kPingpong: the warpgroups take turns where the tile table says so.
template <bool kPingpong, WsStep kStep>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  WsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      CUtensorMap maps[3];
      if (!encode_qkv_maps<Cfg::kBr, Cfg::kBc>(maps, p, b.q, b.k, b.v)) return cudaErrorInvalidValue;
      // The engine: non-causal, one block per SM (the tiles are equal, dealt
      // round-robin), the last round's split along the keys where the
      // workspace allows. Causal: one block per SM taking the tiles longest
      // first from a counter (a static deal of unequal tiles measured slower);
      // without a workspace, one block per tile, which the hardware starts as
      // blocks finish.
      const StepPlan plan = step_plan<kStep>(p);
      FwdSchedule s;
      if (cudaError_t e = plan_fwd_schedule(p, plan.policy, kFwdTiles<Cfg>, plan.persistent,
                                            plan.workspace ? b.workspace : nullptr,
                                            plan.workspace ? b.workspace_bytes : 0, device_sm_count(), stream, s);
          e != cudaSuccess)
        return e;
      return launch_with_smem(ws_kernel<Cfg, T, kPingpong && WsTile<D, Dv>::kPingpong>,
                              dim3(unsigned(s.blocks)), Cfg::kThreads, Cfg::kSmemBytes, stream, maps[0], maps[1],
                              maps[2], static_cast<T*>(b.o), b.lse, p, s.order, s.split, s.counter);
    });
  });
  return err;
}

template <bool kPingpong>
std::string describe_tiles() {
  std::string s = "stages=" + std::to_string(kWsStages);
  WsHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    const bool turns = kPingpong && WsTile<D, Dv>::kPingpong;
    s += "; D=" + std::to_string(D) + (Dv == D ? "" : " Dv=" + std::to_string(Dv)) +
         ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
         " warps=" + std::to_string(Cfg::kWarps) + " smem=" + std::to_string(Cfg::kSmemBytes) + "B" +
         (kPingpong ? (turns ? " ping-pong" : " no ping-pong") : "");
  });
  return s + "; fp16/bf16; GQA; any Nq, Nk";
}

template <WsStep kStep>
const char* describe_schedule() {
  switch (kStep) {
    case WsStep::kBlockPerTile: return "a block per query tile, head by head";
    case WsStep::kPersistent:
      return "a persistent grid: non-causal the tiles dealt round-robin, causal longest first from a counter";
    case WsStep::kEngine:
      return "a persistent grid: non-causal the last round split along the keys, causal longest tiles first "
             "from a counter";
  }
  return "";
}

template <bool kPingpong, WsStep kStep>
Variant make_variant(const std::string& name) {
  Variant v;
  v.name = name;
  v.rung = "12_ws_pingpong";
  v.on_request = kStep != WsStep::kEngine;
  v.unsupported_reason = unsupported;
  v.workspace_bytes = [](const AttnProblem& p) {  // the split's (non-causal), the counter (causal)
    size_t bytes = 0;
    if (!step_plan<kStep>(p).workspace) return bytes;
    WsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
      bytes = fwd_schedule_workspace_bytes(policy(p), kFwdTiles<Config<decltype(dims)::D, decltype(dims)::Dv>>,
                                           device_sm_count());
    });
    return bytes;
  };
  v.launch = launch<kPingpong, kStep>;
  v.describe = [] {
    return std::string("sm_90a wgmma, K/V by TMA from a producer warpgroup, softmax overlapped with P·V") +
           (kPingpong ? ", the compute warpgroups alternate on the tensor cores" : "") + "; " +
           describe_schedule<kStep>() + "; " + describe_tiles<kPingpong>();
  };
  return v;
}

}  // namespace

// The engine (ws+stage2+pingpong, and without the turns), then page 12's steps
// towards it, run when --variant names them.
std::vector<Variant> make_ws_pingpong_variants() {
  const std::string engine = std::string("ws+stage") + std::to_string(kWsStages);
  return {make_variant<false, WsStep::kEngine>(engine), make_variant<true, WsStep::kEngine>(engine + "+pingpong"),
          make_variant<false, WsStep::kBlockPerTile>("ws+tma"),
          make_variant<true, WsStep::kBlockPerTile>("ws+tma+pingpong"),
          make_variant<true, WsStep::kPersistent>("ws+tma+pingpong+persistent")};
}

}  // namespace attnlab
