// ============================================================================
// Dynamic-mask attention, backward (flash-dmattn semantics) with tile skipping
// ============================================================================
// FlashAttention-2's backward order (Dao, 2023, Algorithm 2) with the forward's
// skip test: one block per (64-key tile j, KV head, batch) holds K_j, V_j in
// shared memory and dK_j, dV_j in registers, and walks the query tiles i of
// every query head that reads this KV head (GQA), skipping before any load a
// tile whose 64 x 64 mask is all zero (the tile bits of dmattn_tiles.cuh):
//   Sᵀ = K_j Q_iᵀ;  Pᵀ = exp(scale·Sᵀ + bias (softcap) − LSE), 0 where masked
//   dPᵀ = V_j dO_iᵀ;  dSᵀ = Pᵀ ∘ (dPᵀ − Δ) ∘ softcap',  Δ = rowsum(dO ∘ O)
//   dV_j += Pᵀ dO_i;  dK_j += scale·dSᵀ Q_i;  dQ_i += scale·dS K_j;  dBias += dS
// dQ and dBias are summed in fp32 (atomics; on the wgmma core dQ by TMA
// tensor reductions) and converted to the input dtype at the end.
// Query chunks: a sparse mask can put nearly all active tiles in a few key
// tiles, so each key tile's (query tile, head) slots are dealt round-robin to
// `chunks` blocks, which add dK, dV into fp32 accumulators; after the mask
// pass a plan kernel drops the chunks where the work turns out even
// (dma_backward_resolve_chunks). Deterministic mode (bitwise identical runs):
// one chunk, dQ from a second kernel per query tile (dma_bwd_dq_kernel) and
// dBias copies summed in a fixed order, so no sum depends on block order.
// The wgmma core (sm_90a): the five products as warpgroup MMAs; the next active
// tile's Q, dO arrive (TMA) in a second slot while this one is computed.
// Design, budget and measurements: docs/dmattn_backward.md.
//
// Tiles (DmaBwdConfig, checked below): Br = Bc = 64, 4 warps (one warpgroup).
//   core     D    Q/dO slots  queries per Sᵀ slice  blocks/SM bound  smem bytes
//   mma     32    1           32                    -                30208
//   mma     64    1           32                    -                46592
//   mma     96    1           32                    -                62976
//   mma    128    1           32                    -                79360
//   wgmma   64    2           64                    3                59392
//   wgmma  128    2           32                    -               108544
// Registers: docs/dmattn_backward.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128} (wgmma: 64, 128); any Nq,
// Nk; H % Hkv == 0; the forward's masks (bytes or bits) and bias broadcasts,
// dBias; softcap; causal (bottom-right); deterministic mode.
//
// Run: build/flash_attn_mma --B 1 --H 2 --Hkv 1 --N 2048 --D 128 --causal --mask topk --window 512 --bias --bwd --check
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "dmattn/bwd_config.cuh"
#include "dmattn/bwd_dq_kernel.cuh"
#include "dmattn/bwd_kernel.cuh"
#include "dmattn/bwd_passes.cuh"
#include "dmattn/bwd_scheduler.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"

namespace attnlab {
namespace {

static_assert(DmaBwdConfig<64, true>::kSmemBytes == 59392 && DmaBwdConfig<128, true>::kSmemBytes == 108544,
              "header: the wgmma core's shared memory");
static_assert(DmaBwdConfig<32>::kSmemBytes == 30208 && DmaBwdConfig<64>::kSmemBytes == 46592 &&
                  DmaBwdConfig<96>::kSmemBytes == 62976 && DmaBwdConfig<128>::kSmemBytes == 79360,
              "header: the mma.sync core's shared memory");
static_assert(DmaBwdConfig<64>::kBr == 64 && DmaBwdConfig<64>::kBc == 64 && DmaBwdConfig<64>::kWarps == 4 &&
                  DmaBwdConfig<64, true>::kBr == 64 && DmaBwdConfig<64, true>::kBc == 64 &&
                  DmaBwdConfig<64, true>::kWarps == 4,
              "header: Br = Bc = 64, 4 warps on both cores");
static_assert(DmaBwdConfig<64>::kQdoStages == 1 && DmaBwdConfig<64, true>::kQdoStages == 2 &&
                  DmaBwdConfig<128, true>::kQdoStages == 2,
              "header: one Q/dO slot on mma.sync, two on wgmma");
static_assert(DmaBwdConfig<32>::kHalf == 32 && DmaBwdConfig<128>::kHalf == 32 && DmaBwdConfig<64, true>::kHalf == 64 &&
                  DmaBwdConfig<128, true>::kHalf == 32,
              "header: queries per Sᵀ slice");
static_assert(DmaBwdConfig<64, true>::kMinBlocks == 3 && DmaBwdConfig<128, true>::kMinBlocks == 1 &&
                  DmaBwdConfig<64>::kMinBlocks == 1 && DmaBwdConfig<128>::kMinBlocks == 1,
              "header: the blocks per SM the registers are bounded for");

}  // namespace

std::string dma_backward_core_name(const DynamicMaskProblem& p, DmaCore requested) {
  if (requested == DmaCore::kMma) return "mma";
  static const bool hopper = hopper_wgmma_unsupported().empty();
  const bool wgmma = hopper && DmaBwdWgmmaHeadDims::dispatch(p.D, p.D, [](auto) {});
  if (requested == DmaCore::kWgmma || requested == DmaCore::kWgmmaCpAsync) return wgmma ? "wgmma" : "";
  return wgmma ? "wgmma" : "mma";
}

std::string dma_backward_unsupported(const DynamicMaskProblem& p) {
  if (std::string e = dma_forward_unsupported(p); !e.empty() && e.find("head dim") == std::string::npos) return e;
  if (!DmaBwdHeadDims::dispatch(p.D, p.D, [](auto) {}))
    return "backward: head dim " + std::to_string(p.D) + " not in " + DmaBwdHeadDims::names();
  if ((p.Nk + 63) / 64 > 2147483647) return "Nk too large";
  return "";
}

namespace {
// Workspace layout (floats, each part 16-byte aligned): dq_accum [rows·D]
// (default mode only), Δ [rows], dBias accumulator copies, the mask summary,
// and with more than one query chunk the dK and dV accumulators
// [B·Hkv·Nk·D] each.
struct BwdWorkspace {
  size_t dq = 0, delta = 0, dbias = 0, summary = 0, plan = 0, dkv = 0;  // offsets in floats
  size_t total_floats = 0;
  DbiasTarget target;
};
size_t round4(size_t n) { return (n + 3) / 4 * 4; }
BwdWorkspace plan_workspace(const DynamicMaskProblem& p, bool deterministic, int chunks) {
  BwdWorkspace w;
  const size_t rows = size_t(p.B) * p.H * p.Nq;
  size_t at = 0;
  w.dq = at;
  at += deterministic ? 0 : round4(rows * p.D);
  w.delta = at;
  at += round4(rows);
  w.dbias = at;
  if (p.bias.data != nullptr) {
    w.target.copy_elems = p.bias.elems(p.Nk);
    w.target.per_batch = deterministic && p.bias.b == 1 && p.B > 1;
    w.target.per_kv_head = deterministic && p.bias.h == 1 && p.Hkv > 1;
    w.target.batches = p.B;
    w.target.Hkv = p.Hkv;
    at += round4(size_t(w.target.copies()) * size_t(w.target.copy_elems));
  }
  w.summary = at;
  at += round4(dma_mask_summary_bytes(p) / sizeof(float));
  w.plan = at;  // the chunk plan: kPlanWords 64-bit words (dma_bwd_chunk_plan_kernel)
  at += round4(2 * kPlanWords);
  w.dkv = at;
  if (chunks > 1) at += 2 * round4(size_t(p.B) * p.Hkv * p.Nk * p.D);
  w.total_floats = at;
  return w;
}
constexpr int kMaxChunks = 4096;  // a forced count above this is refused
// The automatic rule's slots per block with a mask (dma_backward_resolve_chunks):
// narrow = the key tiles alone give fewer blocks than SMs, wide = at least one per SM.
constexpr int kDmaBwdSlotsPerChunkNarrow = 16;
constexpr int kDmaBwdSlotsPerChunkWide = 32;
}  // namespace

// The automatic query-chunk count.
//  - Deterministic mode: 1, always (dK, dV then never see a floating-point
//    atomic; their sums keep one order).
//  - Forced (> 0): as given (blocks without a slot add nothing).
//  - Without a mask every slot is active, so the work per key tile is known:
//    1 when the unsplit grid (key tiles · Hkv · B blocks) already gives every
//    SM two blocks (the kernel fits two per SM: 240 registers x 128 threads,
//    ~80 KB shared memory at D = 128), else enough chunks for two blocks per
//    SM, keeping at least 4 slots per chunk (the forward's split-KV rule).
//  - With a mask the host cannot see how the active tiles spread over the key
//    tiles, and a causal top-W mask of a query-broadcast bias puts nearly all
//    of them in a few key tiles (at L = 16K, in the first ~48 of 256): one
//    block per key tile then walks them serially while the rest of the GPU
//    idles. So chunk by the worst case: at most a fixed number of slots per
//    block (ceil(slots / that), slots = group · query tiles, the longest
//    column's): kDmaBwdSlotsPerChunkNarrow = 16 while the key tiles alone (the
//    unsplit grid) give fewer blocks than the GPU has SMs — the chunks must
//    then make the parallelism as well as break the skew — and
//    kDmaBwdSlotsPerChunkWide = 32 once they give at least one per SM, where
//    the chunks only break the skew and each extra one is a block that adds
//    its dK, dV once more (each count against its neighbours:
//    docs/experiments.md). What chunks cost when the mask is in fact
//    dense: each block adds 2·64·D floats of dK, dV once per >= 32 tiles,
//    while every tile already adds 64·D floats of dQ, i.e. at most 2/32 more
//    atomic traffic (half the operations on sm_90, vector reductions), plus a
//    memset and a conversion pass over 2·B·Hkv·Nk·D floats.
//    Caps: at most 64 chunks and at most 64 blocks per SM in all (32 waves at
//    two resident blocks per SM), because a block whose slots are all inactive
//    still costs a launch and one round trip to read its skip bits (at L =
//    32K the cap gives 16 chunks, the fastest count there).
//    --bwd-chunks overrides it.
//  - The chunk plan (dma_backward_plans_chunks): with a mask and at least 4
//    blocks per SM from the key tiles alone, the count is launched as above,
//    but dma_bwd_chunk_plan_kernel counts every key tile's active slots after
//    the mask pass, and where the busiest key tile holds at most 5/4 of the
//    mean the blocks deal the slots to one chunk (dma_bwd_kernel's
//    live_chunks; the other chunks' blocks leave at once, dK and dV stored
//    directly). The host cannot tell a dense mask from a skewed sparse one
//    with as many active key-tile blocks; the mask pass can. A causal mask
//    keeps its chunks (its busiest key tile holds twice the mean), where
//    they are faster than one.
namespace {
// The unsplit grid: one block per (64-key tile, KV head, batch).
int64_t key_tile_blocks(const DynamicMaskProblem& p) { return int64_t((p.Nk + kDmaBc - 1) / kDmaBc) * p.Hkv * p.B; }
}  // namespace

int dma_backward_resolve_chunks(const DynamicMaskProblem& p, bool deterministic, int requested) {
  if (deterministic) return 1;
  if (requested > 0) return requested;
  const int sms = device_sm_count();
  const int64_t unsplit = key_tile_blocks(p);
  const int64_t slots = int64_t(p.H / p.Hkv) * ((p.Nq + kDmaBr - 1) / kDmaBr);
  int64_t want;
  if (p.mask.data == nullptr) {
    if (unsplit >= 2 * int64_t(sms)) return 1;
    want = std::min<int64_t>((2 * int64_t(sms) + unsplit - 1) / unsplit, slots / 4);
  } else {
    const int64_t per_chunk = unsplit >= sms ? kDmaBwdSlotsPerChunkWide : kDmaBwdSlotsPerChunkNarrow;
    want = (slots + per_chunk - 1) / per_chunk;
  }
  const int64_t grid_cap = std::max<int64_t>(1, 64 * int64_t(sms) / std::max<int64_t>(1, unsplit));
  return int(std::max<int64_t>(1, std::min<int64_t>({want, 64, grid_cap, slots})));
}

bool dma_backward_plans_chunks(const DynamicMaskProblem& p, bool deterministic, int requested) {
  if (deterministic || requested > 0 || p.mask.data == nullptr) return false;
  // Causal with Nq > 0.4·Nk: the causal range alone puts the busiest key tile
  // above 5/4 of the mean (Nq >= Nk: twice; below, Tk / (Tk - Tq/2) in tiles),
  // so the plan could only keep the chunks; skip its kernel.
  if (p.causal && 5 * int64_t(p.Nq) > 2 * int64_t(p.Nk)) return false;
  return dma_backward_resolve_chunks(p, deterministic, requested) > 1 &&
         key_tile_blocks(p) >= 4 * int64_t(device_sm_count());
}

int dma_backward_walked_chunks(const DynamicMaskProblem& p, bool deterministic, int requested, const float* workspace) {
  const int chunks = dma_backward_resolve_chunks(p, deterministic, requested);
  if (!dma_backward_plans_chunks(p, deterministic, requested) || workspace == nullptr) return chunks;
  unsigned long long live = 0;
  const BwdWorkspace w = plan_workspace(p, deterministic, chunks);
  if (cudaMemcpy(&live, reinterpret_cast<const unsigned long long*>(workspace + w.plan) + kPlanLiveChunks, sizeof live,
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    return chunks;
  return int(live);
}

size_t dma_backward_workspace_bytes(const DynamicMaskProblem& p, bool deterministic, int q_chunks) {
  return plan_workspace(p, deterministic, dma_backward_resolve_chunks(p, deterministic, q_chunks)).total_floats *
         sizeof(float);
}

cudaError_t dma_backward(const DynamicMaskProblem& p, const DmaBackwardArgs& a, cudaStream_t stream) {
  if (!dma_backward_unsupported(p).empty()) return cudaErrorInvalidValue;
  const int chunks = dma_backward_resolve_chunks(p, a.deterministic, a.q_chunks);
  const int64_t kv_tiles = (p.Nk + kDmaBc - 1) / kDmaBc;
  const int64_t slots = int64_t(p.H / p.Hkv) * ((p.Nq + kDmaBr - 1) / kDmaBr);
  if (chunks > kMaxChunks || kv_tiles * chunks > 2147483647 || p.Hkv > 65535 || p.B > 65535 ||
      slots + int64_t(DmaBwdConfig<64>::kThreads + 1) * chunks > 2147483647)  // grid; the kernel's int slot indices
    return cudaErrorInvalidValue;
  BwdWorkspace w = plan_workspace(p, a.deterministic, chunks);
  if (a.workspace == nullptr || a.workspace_bytes < w.total_floats * sizeof(float)) return cudaErrorInvalidValue;
  // Every part 16-byte aligned: the wgmma core's tensor map of dq_accum needs it.
  if (!dma_aligned(a.workspace, 16)) return cudaErrorInvalidValue;
  // The main kernels copy Q, K, V and dO in 16-byte pieces (cp.async, TMA)
  // and store dK, dV (and the deterministic dQ) in pairs: refused, not a
  // misaligned-address fault. (O and dQ otherwise may sit anywhere: the Δ
  // pass and the dQ conversion have element-wise versions.)
  if (!dma_aligned(a.q, 16) || !dma_aligned(a.k, 16) || !dma_aligned(a.v, 16) || !dma_aligned(a.dout, 16) ||
      !dma_aligned(a.dk, 4) || !dma_aligned(a.dv, 4) || !dma_aligned(a.dq, 4))
    return cudaErrorInvalidValue;
  const int64_t rows = int64_t(p.B) * p.H * p.Nq;
  const int64_t kv_elems = int64_t(p.B) * p.Hkv * p.Nk * p.D;
  float* dq_accum = a.deterministic ? nullptr : a.workspace + w.dq;
  float* delta = a.workspace + w.delta;
  float* dkv_accum = chunks > 1 ? a.workspace + w.dkv : nullptr;  // dK [kv_elems], then dV at + kv_elems
  if (p.bias.data != nullptr) w.target.base = a.workspace + w.dbias;
  // The forward's summary where the caller passes it (same problem, same
  // mask), else this call's own pre-pass.
  MaskSummary summary;
  cudaError_t err = cudaSuccess;
  if (a.mask_summary != nullptr && p.mask.data != nullptr)
    summary = dma_mask_summary_view(p, const_cast<uint32_t*>(a.mask_summary));
  else
    err = dma_summarize_mask(p, reinterpret_cast<uint32_t*>(a.workspace + w.summary), &summary, stream);
  // Δ by 16-byte loads where O and dO allow, which also zeroes dq_accum;
  // else the warp-per-row kernel and a memset.
  const bool delta_vec = dma_aligned(a.o, 16);  // (dO: 16-byte aligned, checked above)
  if (err == cudaSuccess && dq_accum && !delta_vec)
    err = cudaMemsetAsync(dq_accum, 0, size_t(rows) * p.D * sizeof(float), stream);
  if (err == cudaSuccess && w.target.base)
    err = cudaMemsetAsync(w.target.base, 0, size_t(w.target.copies()) * w.target.copy_elems * sizeof(float), stream);
  // The automatic count with a mask, where the key tiles alone give every SM
  // two waves of two blocks: let the mask pass's counts drop the chunks on
  // the device when the active slots are spread evenly (a dense mask).
  unsigned long long* chunk_plan = nullptr;
  if (err == cudaSuccess && dma_backward_plans_chunks(p, a.deterministic, a.q_chunks)) {
    chunk_plan = reinterpret_cast<unsigned long long*>(a.workspace + w.plan);
    err = cudaMemsetAsync(chunk_plan, 0, kPlanWords * sizeof(unsigned long long), stream);
    if (err == cudaSuccess) {
      dma_bwd_chunk_plan_kernel<<<dim3(unsigned(kv_tiles), unsigned(p.Hkv), unsigned(p.B)), 128, 0, stream>>>(
          p, summary, chunks, chunk_plan);
      err = cudaGetLastError();
    }
  }
  if (err == cudaSuccess && dkv_accum) {  // both halves, dK then dV (not where the plan decides one chunk)
    zero_dkv_accum_kernel<<<1024, 256, 0, stream>>>(dkv_accum, 2 * kv_elems, chunk_plan);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return err;
  std::string core = dma_backward_core_name(p, a.core);
  if (core.empty()) return cudaErrorInvalidValue;
  // The wgmma core adds dQ by TMA tensor reductions: the map of dq_accum. (The
  // workspace is 16-byte aligned and D a multiple of 32, so this fails only
  // without the driver's encoder; then the mma.sync core, which uses atomics.)
  const int64_t q_heads = int64_t(p.B) * p.H;  // the maps' heads: rows·D blocks of dq_accum, Q, dO
  CUtensorMap tma_dq{}, tma_q{}, tma_do{};
  if (core == "wgmma" && dq_accum && !encode_f32_head_tiles<kDmaBr>(&tma_dq, dq_accum, q_heads, p.Nq, p.D)) {
    if (a.core != DmaCore::kAuto) return cudaErrorNotSupported;
    core = "mma";
  }
  // Q and dO by TMA on the wgmma core where their bases are 16-byte aligned
  // (else cp.async).
  const bool qdo_tma = core == "wgmma" && encode_head_tiles<kDmaBr>(&tma_q, a.q, p.dtype, q_heads, p.Nq, p.D) &&
                       encode_head_tiles<kDmaBr>(&tma_do, a.dout, p.dtype, q_heads, p.Nq, p.D);
  auto run = [&](auto main_cfg) {
    using Cfg = decltype(main_cfg);                     // the main kernel's core
    using MmaCfg = DmaBwdConfig<Cfg::kHeadDim, false>;  // the deterministic dQ kernel is mma.sync
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      if (delta_vec)
        dma_bwd_delta_vec_kernel<T, Cfg::kHeadDim><<<unsigned((rows + 63) / 64), 256, 0, stream>>>(
            static_cast<const T*>(a.o), static_cast<const T*>(a.dout), delta, dq_accum, rows);
      else
        dma_bwd_delta_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, stream>>>(
            static_cast<const T*>(a.o), static_cast<const T*>(a.dout), delta, rows, p.D);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      // Chunks of one key tile are neighbours in grid.x (j·chunks + c): they run
      // at the same time and share K_j, V_j through L2, and the key tiles of
      // the causal range's long columns (small j) start first. (Where the chunk
      // plan drops the chunks the kernel reads the grid chunk-major: dma_bwd_kernel.)
      const dim3 grid(unsigned(kv_tiles * chunks), unsigned(p.Hkv), unsigned(p.B));
      const bool bits = p.mask_format == DmaMaskFormat::kBits;
      e = launch_with_smem(bits ? dma_bwd_kernel<Cfg, T, true> : dma_bwd_kernel<Cfg, T, false>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                           static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                           static_cast<const T*>(a.dout), static_cast<const float*>(a.lse),
                           static_cast<const float*>(delta), dq_accum, tma_dq, tma_q, tma_do, qdo_tma,
                           static_cast<T*>(a.dk), static_cast<T*>(a.dv), dkv_accum, w.target, p, summary, chunks,
                           static_cast<const unsigned long long*>(chunk_plan), a.rotate_slots);
      if (e != cudaSuccess) return e;
      if (dkv_accum) {  // dK = scale · Σ chunks, dV = Σ chunks, in the input dtype
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(dkv_accum, 1, static_cast<T*>(a.dk), kv_elems,
                                                                p.scale, chunk_plan);
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(dkv_accum + kv_elems, 1, static_cast<T*>(a.dv),
                                                                kv_elems, 1.f, chunk_plan);
      }
      if (a.deterministic) {
        const dim3 dq_grid(unsigned((p.Nq + MmaCfg::kBr - 1) / MmaCfg::kBr), unsigned(p.H), unsigned(p.B));
        e = launch_with_smem(bits ? dma_bwd_dq_kernel<MmaCfg, T, true> : dma_bwd_dq_kernel<MmaCfg, T, false>, dq_grid, MmaCfg::kThreads, MmaCfg::kSmemBytes, stream,
                             static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                             static_cast<const T*>(a.dout), static_cast<const float*>(a.lse),
                             static_cast<const float*>(delta), static_cast<T*>(a.dq), p, summary);
        if (e != cudaSuccess) return e;
      } else if (dma_aligned(a.dq, 8)) {  // rows·D is a multiple of 4 (D of 32)
        f32_to_dtype_vec4_kernel<T><<<1024, 256, 0, stream>>>(dq_accum, static_cast<T*>(a.dq), rows * p.D);
      } else {
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(dq_accum, 1, static_cast<T*>(a.dq), rows * p.D);
      }
      if (w.target.base && a.dbias)
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(w.target.base, w.target.copies(),
                                                                static_cast<T*>(a.dbias), w.target.copy_elems);
      return cudaGetLastError();
    });
  };
  if (core == "wgmma")
    DmaBwdWgmmaHeadDims::dispatch(p.D, p.D, [&](auto dims) { run(DmaBwdConfig<decltype(dims)::D, true>{}); });
  else
    DmaBwdHeadDims::dispatch(p.D, p.D, [&](auto dims) { run(DmaBwdConfig<decltype(dims)::D>{}); });
  return err;
}

}  // namespace attnlab
