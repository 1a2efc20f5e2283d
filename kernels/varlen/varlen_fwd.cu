// ============================================================================
// Variable-length forward — a packed batch on rung 12's engine
// ============================================================================
// What changes against rung 12 (`ws+stage2+pingpong`): the same producer
// warpgroup, TMA ring, ping-pong compute warpgroups and epilogue math, but
//   NEW (layout): Q, K, V and O are packed [total, heads, D], FlashAttention's
//        varlen layout; each is one tensor map of (D, total rows, heads) with
//        row stride heads·D (host/tensor_map.h, encode_strided_tiles). A tile
//        of sequence b loads rows q0_b + m·Br.. and k0_b + j·Bc..: boxes that
//        run past the sequence read the next one's rows (Q rows are not stored,
//        keys are masked by the sequence's own length) or zeros past the end;
//   NEW (problem per item): each work item is one (query tile, head) of one
//        sequence, which runs as its own problem (varlen_seq_problem: its
//        lengths, bottom-right causal within it), so the mainloop's masks and
//        tile counts are rung 12's unchanged;
//   NEW (order, varlen_prepare.cuh): a prepare kernel sorts the query tiles by
//        key-tile count from cu_seqlens on the device, and the persistent grid
//        takes them longest first from a counter (rung 12's dynamic order), so
//        one long sequence among short ones starts first; no stream-K split;
//   NEW (epilogue): O rows at (q0_b + r)·H·Dv, LSE [H, total_q].
//
// Per block and tiles: rung 12's (WsTile, hopper/fwd_tile.h), checked below:
//   D / Dv     Br   Bc  warpgroups  ping-pong
//   64        192  128   3 + 1       yes
//   128       128  176   2 + 1       yes
//   256       128   80   2 + 1       no
//   192 / 128 128  128   2 + 1       yes
//   128 / 64  128  128   2 + 1       yes
//
// Supports: fp16, bf16; the (D, Dv) above; GQA/MQA; sequences of any length,
// 0 included; causal or not; O and LSE. Needs sm_90a, cuTensorMapEncodeTiled.
// Run: build/flash_attn_mma --varlen 8192,1,517,3000 --H 8 --D 128 --causal --unverified
// ============================================================================

#include "varlen/varlen.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/row_fragments.cuh"
#include "common/tma.cuh"
#include "hopper/fwd_kernel.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "hopper/fwd_tile.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "varlen/varlen_prepare.cuh"
#include "varlen/varlen_schedule.h"

namespace attnlab {
namespace {

template <int D, int Dv>
using Config = WsEngineConfig<D, Dv>;

// The header's table.
template <int D, int Dv, int kBr, int kBc, int kThreads, bool kPingpong>
constexpr bool kTableRow = Config<D, Dv>::kBr == kBr && Config<D, Dv>::kBc == kBc &&
                           Config<D, Dv>::kThreads == kThreads && WsTile<D, Dv>::kPingpong == kPingpong;
static_assert(kTableRow<64, 64, 192, 128, 512, true>, "header: D=64");
static_assert(kTableRow<128, 128, 128, 176, 384, true>, "header: D=128");
static_assert(kTableRow<256, 256, 128, 80, 384, false>, "header: D=256");
static_assert(kTableRow<192, 128, 128, 128, 384, true>, "header: D=192, Dv=128");
static_assert(kTableRow<128, 64, 128, 128, 384, true>, "header: D=128, Dv=64");

using VarlenHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<256, 256>, HeadDims<192, 128>,
                                   HeadDims<128, 64>>;

// What the kernel reads of the batch: the offsets, the packed row counts and
// the order the prepare kernel wrote.
struct VarlenArgs {
  const int* cu_q;
  const int* cu_k;
  int total_q, total_k;
  const VarlenTile* tiles;
  const int* n_items;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Work item `item`: its sequence (as a problem of its own), and rung 12's
// work of the (query tile, head) within it: every key tile the tile needs.
struct VarlenWork {
  VarlenSeq seq;
  AttnProblem p;
  WsWork w;
};
template <typename Cfg>
__device__ __forceinline__ VarlenWork varlen_work(const AttnProblem& p, const VarlenArgs& a, int item) {
  const VarlenTile tile = a.tiles[item / p.H];
  VarlenWork v;
  v.seq = varlen_seq(a.cu_q, a.cu_k, tile.seq, a.total_q, a.total_k);
  v.p = varlen_seq_problem(p, v.seq);
  v.w.head = item % p.H;
  v.w.kv_head = int(v.p.kv_head(v.w.head));
  v.w.q_start = tile.tile * Cfg::kBr;
  v.w.kv_begin = 0;
  v.w.n_tiles = kv_tiles_for_query_tile(v.p, v.w.q_start, Cfg::kBr, Cfg::kBc);
  return v;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename Cfg, typename T, bool kPingpong>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
varlen_fwd_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                  const __grid_constant__ CUtensorMap tma_v, T* __restrict__ o, float* __restrict__ lse,
                  const AttnProblem p, const VarlenArgs a, int* __restrict__ counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Rung 12's dynamic order over the prepared items: round 0 takes item
  // blockIdx.x, later rounds the counter's next (hopper/fwd_scheduler.cuh).
  TileOrder order;
  order.items = *a.n_items;
  order.heads = p.H;
  order.dynamic = true;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ws_fwd_block<Cfg, T>(
      smem_raw, order, counter, &tma_q, &tma_k, &tma_v,
      [&](const WsShared<Cfg, T>& sm, const WorkPiece& piece, WsRing& ring) __attribute__((always_inline)) {
        const VarlenWork v = varlen_work<Cfg>(p, a, piece.item);
        ws_load_tiles<Cfg, T>(sm, &tma_q, &tma_k, &tma_v, v.w.head, v.w.kv_head, v.seq.q0 + v.w.q_start,
                              v.w.n_tiles, [](int i) { return i; }, ring, v.seq.k0);
      },
      [&](const WsShared<Cfg, T>& sm, const WorkPiece& piece, WsRing& ring) __attribute__((always_inline)) {
        const VarlenWork v = varlen_work<Cfg>(p, a, piece.item);
        float O[Cfg::kTilesO][4] = {};
        RowStats stats;
        ws_compute<Cfg, T, kPingpong>(sm, v.p, v.w, ring, O, stats);
        // O rows of this head at (q0 + r)·H·Dv + head·Dv, LSE at head·total_q + q0 + r.
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
        const int row0 = v.w.q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;
        const int64_t o_row_stride = int64_t(p.H) * p.Dv;
        store_output_rows<T>(O, stats, p.scale, v.seq.len_q, row0, /*col0=*/0, lane % 4, /*write_lse=*/true,
                             o + int64_t(v.seq.q0) * o_row_stride + int64_t(v.w.head) * p.Dv, o_row_stride,
                             lse + int64_t(v.w.head) * a.total_q + v.seq.q0);
      });
#endif
}

// The order's Br, Bc at problem p's head dims (0 when no config has them).
void tile_of(const AttnProblem& p, int& Br, int& Bc, int& smem) {
  Br = Bc = smem = 0;
  VarlenHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
    Br = Cfg::kBr, Bc = Cfg::kBc, smem = Cfg::kSmemBytes;
  });
}

}  // namespace

std::string varlen_fwd_unsupported(const VarlenProblem& vp) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  const AttnProblem& p = vp.shape;
  int Br, Bc, smem;
  tile_of(p, Br, Bc, smem);
  if (Br == 0) return VarlenHeadDims::not_in(p.D, p.Dv);
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  if (p.B < 1 || vp.total_q < 0 || vp.total_k < 0) return "a packed batch needs B >= 1 and row counts >= 0";
  if (varlen_max_tiles(vp.total_q, p.B, Br) * p.H >= TileOrder::kMaxItems)
    return "more than 2^30 (query tile, head) items";
  return smem_unsupported(size_t(smem));
}

bool varlen_fwd_tile(int D, int Dv, int* Br, int* Bc) {
  AttnProblem p;
  p.D = D, p.Dv = Dv;
  int smem;
  tile_of(p, *Br, *Bc, smem);
  return *Br > 0;
}

size_t varlen_fwd_workspace_bytes(const VarlenProblem& vp) {
  int Br, Bc, smem;
  tile_of(vp.shape, Br, Bc, smem);
  if (Br == 0) return 0;
  return VarlenWorkspace::bytes(vp.shape.B, varlen_max_tiles(vp.total_q, vp.shape.B, Br));
}

cudaError_t varlen_fwd(const VarlenProblem& vp, const VarlenBuffers& b, cudaStream_t stream) {
  const AttnProblem& p = vp.shape;
  if (b.workspace == nullptr || b.workspace_bytes < varlen_fwd_workspace_bytes(vp))
    return launch_failed(cudaErrorInvalidValue, "the variable-length forward needs varlen_fwd_workspace_bytes of "
                                                "workspace");
  cudaError_t err = cudaErrorInvalidValue;
  VarlenHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    err = dispatch_dtype(p.dtype, [&](auto type) -> cudaError_t {
      using T = decltype(type);
      if (vp.total_q == 0) return cudaSuccess;  // no query row: nothing to write
      // Packed [total, heads, D]: rows of heads·D elements, heads D apart. An
      // empty K and V (no sequence has keys) are never read: mapped as one row
      // of Q, which exists (Dv <= D in every config).
      const int kv_heads = p.kv_heads();
      CUtensorMap maps[3];
      const bool keys = vp.total_k > 0;
      const int rows_k = keys ? vp.total_k : 1;
      const void* k = keys ? b.k : b.q;
      const void* v = keys ? b.v : b.q;
      if (!encode_strided_tiles<Cfg::kBr>(&maps[0], b.q, p.dtype, p.H, vp.total_q, D, int64_t(p.H) * D, D, "Q") ||
          !encode_strided_tiles<Cfg::kBc>(&maps[1], k, p.dtype, kv_heads, rows_k, D, int64_t(kv_heads) * D, D,
                                          "K") ||
          !encode_strided_tiles<Cfg::kBc>(&maps[2], v, p.dtype, kv_heads, rows_k, Dv, int64_t(kv_heads) * Dv, Dv,
                                          "V"))
        return cudaErrorInvalidValue;
      const VarlenWorkspace ws = VarlenWorkspace::at(b.workspace, p.B);
      if (cudaError_t e = launch_kernel(varlen_prepare<VarlenTiles::kQuery, Cfg::kBr, Cfg::kBc>, dim3(1),
                                        dim3(kVarlenPrepareThreads), size_t(0), stream, p, b.cu_seqlens_q,
                                        b.cu_seqlens_k, p.B, vp.total_q, vp.total_k, p.H, ws);
          e != cudaSuccess)
        return e;
      // A persistent grid: at most one block per SM, none past the most items there can be.
      const int64_t most_items = varlen_max_tiles(vp.total_q, p.B, Cfg::kBr) * p.H;
      const int blocks = int(most_items < device_sm_count() ? most_items : device_sm_count());
      const VarlenArgs args{b.cu_seqlens_q, b.cu_seqlens_k, vp.total_q, vp.total_k, ws.tiles, ws.n_items};
      return launch_with_smem(varlen_fwd_kernel<Cfg, T, WsTile<D, Dv>::kPingpong>, dim3(unsigned(blocks)),
                              Cfg::kThreads, Cfg::kSmemBytes, stream, maps[0], maps[1], maps[2], static_cast<T*>(b.o),
                              b.lse, p, args, ws.counter);
    });
  });
  return err;
}

std::string varlen_fwd_describe() {
  std::string s;
  VarlenHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    s += "D=" + std::to_string(D) + (Dv == D ? "" : " Dv=" + std::to_string(Dv)) + ": Br=" + std::to_string(Cfg::kBr) +
         " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) + " smem=" +
         std::to_string(Cfg::kSmemBytes) + "B" + (WsTile<D, Dv>::kPingpong ? " ping-pong" : "") + "\n";
  });
  return s;
}

}  // namespace attnlab
