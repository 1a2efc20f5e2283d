// attnlab: the dynamic-mask forward's host planning — what dma_forward
// (dmattn_fwd.cu) will run for a problem and its arguments: whether it can
// (dma_forward_unsupported), which core (the tile kernel's mma.sync or wgmma,
// or the gather core), where the mask is scanned, how many split-KV parts and
// pre-pass chunks, how much workspace — and the count of visible pairs that
// the harness's FLOP figures use.
#include <algorithm>
#include <string>
#include <vector>

#include "dmattn/dmattn.h"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/fwd_config.cuh"
#include "host/device.h"
#include "host/rung_host.cuh"

namespace attnlab {
namespace {

std::string operand_unsupported(const char* what, const BroadcastOperand& x, const DynamicMaskProblem& p) {
  if (x.data == nullptr) return "";
  const std::string w = what;
  if (x.b != 1 && x.b != p.B) return w + " batch dim must be 1 or B";
  if (x.h != 1 && x.h != p.H && x.h != p.Hkv) return w + " head dim must be 1, H or Hkv";
  if (x.q != 1 && x.q != p.Nq) return w + " query dim must be 1 or Nq";
  return "";
}

// One block per (query row, head, batch): counts the row's visible keys.
__global__ void count_visible_pairs_kernel(const DynamicMaskProblem p, unsigned long long* count) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int limit = p.Nk;  // keys < limit pass the causal rule
  if (p.causal) limit = int(max(int64_t(0), min(int64_t(p.Nk), int64_t(i) + (p.Nk - p.Nq) + 1)));
  int n = 0;
  if (p.mask.data == nullptr) {
    n = threadIdx.x == 0 ? limit : 0;
  } else if (p.mask_format == DmaMaskFormat::kBits) {  // a word per thread: the bits of keys < limit
    const uint32_t* row = static_cast<const uint32_t*>(p.mask.data) + p.mask.row_offset(b, h, i);
    for (int w = threadIdx.x; w * 32 < limit; w += blockDim.x) {
      const int left = limit - w * 32;
      n += __popc(row[w] & (left >= 32 ? ~0u : (1u << left) - 1u));
    }
  } else {
    const uint8_t* row = static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, i);
    for (int j = threadIdx.x; j < limit; j += blockDim.x) n += row[j] != 0;
  }
  for (int off = 16; off > 0; off /= 2) n += __shfl_xor_sync(0xffffffffu, n, off);
  if (threadIdx.x % 32 == 0 && n > 0) atomicAdd(count, (unsigned long long)n);
}

}  // namespace

cudaError_t dma_count_visible_pairs(const DynamicMaskProblem& p, unsigned long long* d_count, cudaStream_t stream) {
  if (p.Nq > 2147483647 || p.H > 65535 || p.B > 65535) return cudaErrorInvalidValue;
  count_visible_pairs_kernel<<<dim3(p.Nq, p.H, p.B), 256, 0, stream>>>(p, d_count);
  return cudaGetLastError();
}

std::string dma_forward_unsupported(const DynamicMaskProblem& p) {
  if (p.B < 1 || p.H < 1 || p.Hkv < 1 || p.Nq < 1 || p.Nk < 1) return "sizes must be >= 1";
  if (p.H % p.Hkv != 0) return "H must be a multiple of Hkv";
  if (p.H > 65535 || p.B > 65535) return "B and H must be <= 65535 (grid limits)";
  if (int64_t((p.Nq + kDmaBr - 1) / kDmaBr) * p.H > 2147483647) return "Nq / 64 x H exceeds the grid limit";
  if (!(p.softcap >= 0.f)) return "softcap must be >= 0";
  if ((p.Nk + kDmaBc - 1) / kDmaBc > 65535) return "Nk too large for the 16-bit tile list";
  if (std::string e = operand_unsupported("mask", p.mask, p); !e.empty()) return e;
  if (std::string e = operand_unsupported("bias", p.bias, p); !e.empty()) return e;
  if (std::string e = dma_mask_bits_unsupported(p); !e.empty()) return e;
  int tile_bytes = 0;
  if (!DmaHeadDims::dispatch(p.D, p.D, [&](auto dims) { tile_bytes = DmaConfig<decltype(dims)::D>::kTileBytes; }))
    return "head dim " + std::to_string(p.D) + " not in " + DmaHeadDims::names();
  return smem_unsupported(dma_smem_bytes(tile_bytes, p.Nk));
}

int dma_auto_splits(const DynamicMaskProblem& p) {
  const int sms = device_sm_count();
  const int64_t blocks = int64_t((p.Nq + kDmaBr - 1) / kDmaBr) * p.H * p.B;
  // Half the SMs busy already: the combine pass (one block per output row)
  // costs more than the extra parallelism saves (docs/experiments.md).
  if (2 * blocks >= sms) return 1;
  const int64_t tiles = (p.Nk + kDmaBc - 1) / kDmaBc;
  // Two blocks per SM, at most 128 splits, and at least 4 KV tiles per split.
  const int64_t want = (2 * int64_t(sms) + blocks - 1) / blocks;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, 128, tiles / 4})));
}

int dma_resolve_splits(const DynamicMaskProblem& p, int requested) {
  return requested > 0 ? requested : dma_auto_splits(p);
}

// Workspace: the mask summary (16-byte rounded), then the split-KV partials.
size_t dma_forward_workspace_bytes(const DynamicMaskProblem& p, int splits) {
  const size_t summary = (dma_mask_summary_bytes(p) + 15) / 16 * 16;
  if (splits <= 1) return summary;
  return summary + size_t(splits) * size_t(p.B) * p.H * p.Nq * size_t(p.D + 1) * sizeof(float);
}

// Below this many keys the automatic core for one query row is the tile kernel:
// a short row is a few tiles whatever the mask keeps, and the gather kernel's
// key list and per-step softmax cost more than the tiles it could skip (the
// gather kernel is slower up to 1024 keys, faster from 4096 on:
// docs/experiments.md).
constexpr int64_t kDmaGatherMinKeys = 2048;

std::string dma_forward_core_name(const DynamicMaskProblem& p, DmaCore requested) {
  if (requested == DmaCore::kMma) return "mma";
  // One query row with a mask: the key-gather decoding kernel (dma_decode_kernel),
  // requested, or automatic past kDmaGatherMinKeys keys.
  const bool gather_fits = p.Nq == 1 && p.mask.data != nullptr;
  if (requested == DmaCore::kGather) return gather_fits ? "gather" : "";
  if (requested == DmaCore::kAuto && gather_fits && p.Nk > kDmaGatherMinKeys) return "gather";
  static const bool hopper = hopper_wgmma_unsupported().empty();
  const bool wgmma = hopper && DmaWgmmaHeadDims::dispatch(p.D, p.D, [](auto) {});
  if (requested == DmaCore::kWgmma) return wgmma ? "wgmma" : "";
  if (requested == DmaCore::kWgmmaCpAsync) return wgmma ? "wgmma-cp.async" : "";
  return wgmma ? "wgmma" : "mma";
}

std::string dma_forward_mask_scan_name(const DynamicMaskProblem& p, DmaMaskScan requested, int splits,
                                       DmaCore core) {
  if (p.mask.data == nullptr) return "none";
  if (dma_forward_core_name(p, core) == "gather") return "in-kernel";  // it lists its row's keys itself
  if (requested == DmaMaskScan::kPrepass) return "prepass";
  if (requested == DmaMaskScan::kInKernel) return "in-kernel";
  if (requested == DmaMaskScan::kPipelined) return splits == 1 && p.mask.q > 1 ? "pipelined" : "prepass";
  // How many forward blocks would read each mask byte in-kernel: one per
  // query head, batch and (for a query-broadcast mask) query tile it serves.
  const int64_t readers = int64_t(p.mask.b == 1 ? p.B : 1) * (p.H / p.mask.h) *
                          (p.mask.q == 1 ? (p.Nq + kDmaBr - 1) / kDmaBr : 1);
  // In-kernel beats the pre-pass with up to two readers and rows up to 16K
  // keys; beyond, a block's scan (up to 2 MiB at L = 32K) is too long a
  // serial part, and with more readers the mask is read more than once
  // (docs/experiments.md). A bit-packed mask (an eighth of the bytes per
  // block) scans rows 8 times as long in-kernel (faster than the pipelined
  // pre-pass and the pre-pass at L = 16K and 32K).
  const int keys_per_block = (p.Nk + splits - 1) / splits;
  const int in_kernel_keys = p.mask_format == DmaMaskFormat::kBits ? 8 * 16384 : 16384;
  if (readers <= 2 && keys_per_block <= in_kernel_keys) return "in-kernel";
  // Longer rows: the pre-pass, pipelined with the forward where it can be
  // (one split, rows per query) and the mask is not shared by more than two
  // heads (where more share it, the plain pre-pass is faster). Pipelining
  // hides the forward's compute under the pre-pass's traffic; it loses a
  // little only where a sparse mask leaves little work to hide (W = 32).
  return readers <= 2 && splits == 1 && p.mask.q > 1 ? "pipelined" : "prepass";
}

DmaCore dma_forward_core_request(const DynamicMaskProblem& p, const DmaForwardArgs& a) {
  const bool aligned =
      dma_aligned(a.q, 16) && dma_aligned(a.k, 16) && dma_aligned(a.v, 16) && dma_aligned(a.o, 16);
  const bool gather_instead =
      a.core == DmaCore::kAuto && !aligned && dma_forward_core_name(p, DmaCore::kGather) == "gather";
  return gather_instead ? DmaCore::kGather : a.core;
}

const uint32_t* dma_forward_mask_summary(const DynamicMaskProblem& p, const DmaForwardArgs& a) {
  if (a.mask_summary != nullptr && p.mask.data != nullptr) return a.mask_summary;  // given: still this mask's
  const DmaCore requested = dma_forward_core_request(p, a);
  const int splits = dma_resolve_splits(p, a.splits);
  const std::string scan = dma_forward_mask_scan_name(p, a.mask_scan, splits, requested);
  // The summary is the workspace's first part (dma_forward_workspace_bytes):
  // written by the pre-pass, or by the tile kernel's in-kernel scan where it
  // covers whole rows (one split; the gather core reads its row itself).
  const bool in_kernel_rows = scan == "in-kernel" && splits == 1 && dma_forward_core_name(p, requested) != "gather";
  const bool written = scan == "prepass" || scan == "pipelined" || in_kernel_rows;
  return written ? reinterpret_cast<const uint32_t*>(a.workspace) : nullptr;
}

int dma_resolve_prepass_chunks(const DynamicMaskProblem& p, int requested) {
  const int q_tiles = (p.Nq + kDmaBr - 1) / kDmaBr;
  const int want = requested > 0 ? std::min(requested, kDmaMaxPrepassChunks) : kDmaPrepassChunks;
  return std::max(1, std::min(want, q_tiles));
}

// (dmattn.h) Equal shares of the mask bytes: tile m's rows read keys up to
// their causal end (+1, so that a tile reading nothing still weighs a little).
std::vector<int> dma_prepass_chunk_bounds(const DynamicMaskProblem& p, int chunks) {
  const int q_tiles = (p.Nq + kDmaBr - 1) / kDmaBr;
  std::vector<double> prefix(size_t(q_tiles) + 1, 0.0);
  for (int m = 0; m < q_tiles; ++m) prefix[m + 1] = prefix[m] + double(mask_scan::causal_key_end(p, m)) + 1.0;
  std::vector<int> bounds(size_t(chunks) + 1, q_tiles);
  bounds[0] = 0;
  int m = 0;
  for (int c = 1; c < chunks; ++c) {
    const double target = prefix[q_tiles] * c / chunks;
    while (m < q_tiles && prefix[m + 1] <= target) ++m;
    bounds[c] = std::max(bounds[c - 1] + 1, std::min(m, q_tiles - (chunks - c)));  // every chunk >= 1 tile
    m = bounds[c];
  }
  return bounds;
}

}  // namespace attnlab
