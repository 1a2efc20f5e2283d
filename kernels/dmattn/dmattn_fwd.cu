// ============================================================================
// Dynamic-mask attention, forward (flash-dmattn semantics) with tile skipping
// ============================================================================
// What it adds to rung 02 (split-Q, mma.sync): a per-key bias, a data-dependent
// sparse mask, grouped KV heads, softcap — and the reason a sparse mask pays:
// a 64 x 64 tile whose mask is all zero is never loaded nor multiplied.
// Per block (64 query rows of one head, 4 warps of 16 rows):
//  1. Before any K/V/bias traffic, the query tile's "any" and "all ones" bits
//     per key tile (dmattn_tiles.cuh: from the mask pre-pass, or the block's
//     own scan of its rows, DmaMaskScan::kInKernel) are compacted into a list
//     of active tiles, so that the loop prefetches the next *active* tile. A
//     block with no active tile writes O = 0, LSE = -inf and exits.
//  2. Rung 02's stage2 loop over the list (K, V of list[i+1] copied while
//     list[i] is computed); per tile, after S = Q·Kᵀ: scale, bias, softcap
//     c·tanh(S/c), -inf where the mask is 0, past Nk or past the causal
//     diagonal; the online softmax. Every choice (bias, softcap, all-ones
//     tile, aligned pairs) is uniform: no branch runs per element.
// Split-KV (few query blocks): `splits` parts of the causal range, merged by
// LSE; one query row with a mask: dma_decode_kernel gathers the active keys.
// The wgmma core (DmaConfig::kWgmma, sm_90a): both products as rung 07's
// warpgroup MMAs, K and V by TMA where aligned; accumulators in mma.sync's
// layout, so the rest is one code. Docs: docs/dmattn_forward.md,
// docs/dmattn_masks.md, docs/dmattn_decode.md.
//
// Tiles (DmaConfig, checked below): Br = Bc = 64, 4 warps, 2 K/V slots; rows
// padded by 8 halves (mma.sync) or dense in the 128-byte swizzle (wgmma).
// Shared memory, bytes (tile kernels: + list and bitmaps, 2 B + 2 bits a tile):
//   D                   32      64      96     128     192     256
//   mma.sync         25600   46080   66560   87040  128000  168960
//   wgmma                -   41984       -   82944       -       -
//   decode (gather)  37696   54080   70464   86848  119616  152384
// Keys per S slice 64 (32 on mma.sync at D >= 192); wgmma at D = 64 bounded
// for 4 blocks per SM. Registers: docs/dmattn_forward.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128, 192, 256} (wgmma: 64, 128);
// any Nq, Nk; H % Hkv == 0; mask (uint8 or bit-packed) and bias (input dtype)
// each ({B|1}, {H|Hkv|1}, {Nq|1}, Nk) through strides; softcap; causal
// (bottom-right). Writes O and LSE.
// Run: build/flash_attn_mma --B 1 --H 2 --Hkv 1 --N 8192 --D 128 --mask topk --window 1024 --bias --causal --check
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "dmattn/combine_kernel.cuh"
#include "dmattn/decode_kernel.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/fwd_config.cuh"
#include "dmattn/fwd_kernel.cuh"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"

namespace attnlab {
namespace {

static_assert(DmaConfig<32>::kTileBytes == 25600 && DmaConfig<64>::kTileBytes == 46080 &&
                  DmaConfig<96>::kTileBytes == 66560 && DmaConfig<128>::kTileBytes == 87040 &&
                  DmaConfig<192>::kTileBytes == 128000 && DmaConfig<256>::kTileBytes == 168960,
              "header: shared memory per head dim");
static_assert(DmaConfig<64, true>::kTileBytes == 41984 && DmaConfig<128, true>::kTileBytes == 82944,
              "header: shared memory per head dim, wgmma");
static_assert(DmaConfig<64>::kBr == 64 && DmaConfig<64>::kBc == 64 && DmaConfig<64>::kWarps == 4 &&
                  DmaConfig<64>::kStages == 2 && DmaConfig<64, true>::kWarps == 4 && DmaConfig<64, true>::kStages == 2,
              "header: Br = Bc = 64, 4 warps, 2 K/V slots");
static_assert(DmaConfig<128>::kSubCols == 64 && DmaConfig<192>::kSubCols == 32 && DmaConfig<256>::kSubCols == 32 &&
                  DmaConfig<128, true>::kSubCols == 64,
              "header: keys per S slice, 32 on mma.sync at D >= 192");
static_assert(DmaConfig<64, true>::kMinBlocksPerSm == 4 && DmaConfig<128, true>::kMinBlocksPerSm == 1 &&
                  DmaConfig<64>::kMinBlocksPerSm == 1,
              "header: the wgmma core at D = 64 is bounded for 4 blocks per SM");

// The pipelined pre-pass's side streams and events, one set per device,
// created on first use and kept (like cuBLAS's handles). Chunk c runs on side
// stream c — its pre-pass, then its forward — and stream c has a higher
// priority than stream c + 1 (as far as the device's priority levels go), so
// the block scheduler hands a free SM place to the earliest chunk's work:
// chunk c + 1's pre-pass fills what chunk c's leaves, without a gap at the
// kernel boundary, and chunk c's forward runs as soon as its bits exist,
// under the later chunks' memory traffic instead of after it. `lock` keeps
// two host threads from interleaving their records and waits on the events.
struct PrepassPipeline {
  std::mutex lock;
  bool ready = false, failed = false;
  cudaStream_t side[kDmaMaxPrepassChunks] = {};
  cudaEvent_t fork = nullptr, done[kDmaMaxPrepassChunks] = {};
};

PrepassPipeline* prepass_pipeline() {
  static std::mutex created_lock;
  static std::vector<PrepassPipeline*> per_device;
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceCount(&count) != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> guard(created_lock);
  if (per_device.empty()) per_device.assign(size_t(count), nullptr);
  if (device >= int(per_device.size())) return nullptr;
  if (per_device[device] == nullptr) per_device[device] = new PrepassPipeline;  // lives as long as the process
  PrepassPipeline* pl = per_device[device];
  if (!pl->ready && !pl->failed) {
    int least = 0, greatest = 0;
    bool ok = cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess;
    ok = ok && cudaEventCreateWithFlags(&pl->fork, cudaEventDisableTiming) == cudaSuccess;
    for (int c = 0; ok && c < kDmaMaxPrepassChunks; ++c)  // numerically lower = higher priority
      ok = cudaStreamCreateWithPriority(&pl->side[c], cudaStreamNonBlocking, std::min(least, greatest + c)) ==
               cudaSuccess &&
           cudaEventCreateWithFlags(&pl->done[c], cudaEventDisableTiming) == cudaSuccess;
    pl->ready = ok;
    pl->failed = !ok;
    if (!ok) cudaGetLastError();  // clear it: the caller falls back to the plain pre-pass
  }
  return pl->ready ? pl : nullptr;
}

}  // namespace

cudaError_t dma_forward(const DynamicMaskProblem& p, const DmaForwardArgs& a, cudaStream_t stream) {
  if (!dma_forward_unsupported(p).empty()) return cudaErrorInvalidValue;
  const int splits = dma_resolve_splits(p, a.splits);
  if (splits > 65535 / p.B || splits > 4096) return cudaErrorInvalidValue;  // grid.y; combine weights in smem
  const size_t need = dma_forward_workspace_bytes(p, splits);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) return cudaErrorInvalidValue;
  const bool aligned = dma_aligned(a.q, 16) && dma_aligned(a.k, 16) && dma_aligned(a.v, 16) && dma_aligned(a.o, 16);
  const DmaCore requested = dma_forward_core_request(p, a);  // (the gather core where the tile kernels cannot copy)
  const std::string core = dma_forward_core_name(p, requested);
  if (core.empty()) return cudaErrorInvalidValue;
  // A summary given (DmaForwardArgs::mask_summary): no scan at all (the
  // gather core reads its own row whatever it is given).
  const bool summary_given = a.mask_summary != nullptr && p.mask.data != nullptr && core != "gather";
  const std::string scan = summary_given ? "given" : dma_forward_mask_scan_name(p, a.mask_scan, splits, requested);
  const bool scan_in_kernel = scan == "in-kernel";
  uint32_t* summary_storage = reinterpret_cast<uint32_t*>(a.workspace);
  PrepassPipeline* pipeline = scan == "pipelined" ? prepass_pipeline() : nullptr;
  MaskSummary summary;
  cudaError_t err = cudaSuccess;
  if (summary_given)
    summary = dma_mask_summary_view(p, const_cast<uint32_t*>(a.mask_summary));  // read only
  else if (pipeline != nullptr)
    summary = dma_mask_summary_view(p, summary_storage);  // written chunk by chunk below
  else if (!scan_in_kernel)
    err = dma_summarize_mask(p, summary_storage, &summary, stream);
  // The in-kernel scan over whole rows (one split) writes the summary too, for
  // the backward (the kernel's view: where each row goes; the gather core,
  // below, returns before it).
  uint32_t* summary_out = nullptr;
  if (scan_in_kernel && splits == 1) {
    summary = dma_mask_summary_view(p, summary_storage);
    summary_out = summary_storage;
  }
  if (err != cudaSuccess) return err;
  float* partials = a.workspace ? a.workspace + (dma_mask_summary_bytes(p) + 15) / 16 * 4 : nullptr;
  err = cudaErrorInvalidValue;
  // Split-KV: the partials merged by LSE (after either kernel).
  auto combine_partials = [&](auto type) {
    using T = decltype(type);
    const int64_t rows = int64_t(p.B) * p.H * p.Nq;
    const bool many = splits > 16;
    const int threads = many ? 512 : 256;  // >= D: at least one group of D threads
    const size_t smem = (splits + size_t(threads / p.D) * p.D) * sizeof(float);
    auto combine = many ? dma_combine_kernel<T, 512> : dma_combine_kernel<T, 256>;
    return launch_with_smem_overlapped(combine, dim3(unsigned(rows)), threads, int(smem), stream, partials,
                                       static_cast<T*>(a.o), a.lse, splits, rows, p.D);
  };
  if (core == "gather") {
    const bool kv_vec = dma_aligned(a.k, 16) && dma_aligned(a.v, 16);
    DmaHeadDims::dispatch(p.D, p.D, [&](auto dims) {
      constexpr int Dh = decltype(dims)::D;
      err = dispatch_dtype(p.dtype, [&](auto type) {
        using T = decltype(type);
        cudaError_t e = launch_with_smem_overlapped(
            dma_decode_kernel<Dh, T>, dim3(unsigned(p.H), unsigned(p.B * splits)), kDecodeThreads,
            dma_decode_smem_bytes<Dh>(), stream, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
            static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse, p, a.tile_counters, partials, splits, kv_vec,
            mask_scan::mask_vector_loads(p));
        if (e == cudaSuccess && splits > 1) e = combine_partials(T{});
        return e;
      });
    });
    return err;
  }
  // The tile kernels copy Q, K, V in 16-byte pieces and store O in pairs.
  if (!aligned) return cudaErrorInvalidValue;
  auto run = [&](auto cfg) {
    using Cfg = decltype(cfg);
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      const dim3 grid(unsigned((p.Nq + Cfg::kBr - 1) / Cfg::kBr) * unsigned(p.H), unsigned(p.B * splits));
      // The wgmma core's K and V tensor maps (a few microseconds of host
      // time); without them (misaligned bases, no driver entry point) it
      // copies with cp.async.
      CUtensorMap tma_k{}, tma_v{};
      bool use_tma = false;
      if constexpr (Cfg::kWgmma)
        use_tma = core == "wgmma" && encode_head_tiles<Cfg::kBc>(&tma_k, a.k, p.dtype, int64_t(p.B) * p.Hkv, p.Nk, p.D) &&
                  encode_head_tiles<Cfg::kBc>(&tma_v, a.v, p.dtype, int64_t(p.B) * p.Hkv, p.Nk, p.D);
      const int smem = int(dma_smem_bytes(Cfg::kTileBytes, p.Nk));
      if (pipeline != nullptr) {
        // Side stream c, after everything before on the caller's stream:
        // pre-pass of chunk c's query tiles, then their forward; the caller's
        // stream finally waits for every side stream. Plain launches (the
        // forward's griddep_wait is then a no-op), the shared-memory limit
        // set once.
        std::lock_guard<std::mutex> guard(pipeline->lock);
        const int chunks = dma_resolve_prepass_chunks(p, a.prepass_chunks);
        const std::vector<int> bounds = dma_prepass_chunk_bounds(p, chunks);
        auto kernel = p.mask_format == DmaMaskFormat::kBits ? dma_forward_kernel<Cfg, T, true>
                                                            : dma_forward_kernel<Cfg, T, false>;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e == cudaSuccess) e = cudaEventRecord(pipeline->fork, stream);
        int launched = 0;
        for (int c = 0; c < chunks && e == cudaSuccess; ++c) {
          cudaStream_t side = pipeline->side[c];
          e = cudaStreamWaitEvent(side, pipeline->fork, 0);
          if (e == cudaSuccess) e = dma_summarize_mask_tiles(p, summary_storage, bounds[c], bounds[c + 1], side);
          const dim3 chunk_grid(unsigned(bounds[c + 1] - bounds[c]) * unsigned(p.H), unsigned(p.B));
          if (e == cudaSuccess) {
            kernel<<<chunk_grid, Cfg::kThreads, smem, side>>>(
                static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                static_cast<T*>(a.o), a.lse, p, summary, a.tile_counters, partials, 1, tma_k, tma_v, use_tma, false,
                nullptr, bounds[c]);
            e = cudaGetLastError();
          }
          // Recorded even after an error, so that the join below covers
          // every side stream this call touched.
          const cudaError_t r = cudaEventRecord(pipeline->done[c], side);
          if (e == cudaSuccess) e = r;
          ++launched;
        }
        for (int c = 0; c < launched; ++c) {
          const cudaError_t j = cudaStreamWaitEvent(stream, pipeline->done[c], 0);
          if (e == cudaSuccess) e = j;
        }
        return e;
      }
      auto kernel = p.mask_format == DmaMaskFormat::kBits ? dma_forward_kernel<Cfg, T, true>
                                                          : dma_forward_kernel<Cfg, T, false>;
      cudaError_t e = launch_with_smem_overlapped(kernel, grid, Cfg::kThreads, smem, stream,
                                                  static_cast<const T*>(a.q), static_cast<const T*>(a.k),
                                                  static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse, p, summary,
                                                  a.tile_counters, partials, splits, tma_k, tma_v, use_tma,
                                                  scan_in_kernel, summary_out, 0);
      if (e == cudaSuccess && splits > 1) e = combine_partials(T{});
      return e;
    });
  };
  if (core != "mma")
    DmaWgmmaHeadDims::dispatch(p.D, p.D, [&](auto dims) { run(DmaConfig<decltype(dims)::D, true>{}); });
  else
    DmaHeadDims::dispatch(p.D, p.D, [&](auto dims) { run(DmaConfig<decltype(dims)::D>{}); });
  return err;
}

}  // namespace attnlab