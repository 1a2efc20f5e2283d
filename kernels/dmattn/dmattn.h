// attnlab: dynamic-mask attention (flash-dmattn semantics) — the problem
// description shared by the forward and backward kernels, the GPU references
// and the harness, and their host entry points. Docs: docs/dmattn_forward.md,
// docs/dmattn_backward.md, docs/dmattn_masks.md, docs/dmattn_decode.md.
//
//   Q [B, H, Nq, D];  K, V [B, Hkv, Nk, D]  (H % Hkv == 0: query head h reads
//   KV head h / (H / Hkv));  optional mask (uint8, 0 = masked, or bit-packed:
//   DmaMaskFormat) and bias (the input dtype), each broadcastable as
//   ({B|1}, {H|Hkv|1}, {Nq|1}, Nk) and read through strides — a size-1
//   dimension has stride 0, nothing is expanded.
//   S = scale·Q·Kᵀ + bias;  softcap c > 0: S = c·tanh(S / c);  S = -inf where
//   mask == 0 or the causal rule (bottom-right aligned) excludes the pair;
//   O = softmax(S)·V; LSE (natural log). A row that sees no key: O = 0,
//   LSE = -inf. The CPU double reference is kernels/reference/masked_reference_cpu.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "host/attn_problem.h"
#include "host/broadcast_operand.h"

namespace attnlab {

// How the mask's elements are stored.
//   kBytes: one uint8_t per (query, key), 0 = masked (flash-dmattn's bool mask).
//   kBits:  one bit per (query, key), bit k % 32 of 32-bit word k / 32 of the
//           row, 1 = attends; each row padded to a whole number of 64-key
//           tiles (dma_mask_bit_row_words(Nk) words; the padding bits are
//           never read as keys). An eighth of the bytes: at L = 32K the
//           mask's read, which no kernel can hide behind the little compute
//           a sparse mask leaves, shrinks from 512 MiB to 64 MiB. The
//           operand's strides count words; base 8-byte aligned, strides even
//           (each row's tile is one 8-byte load). dma_pack_mask_bits makes
//           one from a byte mask.
enum class DmaMaskFormat { kBytes = 0, kBits = 1 };

// Words of one row of a bit-packed mask (DmaMaskFormat::kBits) over Nk keys:
// two per 64-key tile.
ATTNLAB_HOST_DEVICE inline int64_t dma_mask_bit_row_words(int Nk) { return 2 * ((int64_t(Nk) + 63) / 64); }

struct DynamicMaskProblem {
  int B = 1, H = 1, Hkv = 1, Nq = 1, Nk = 1, D = 64;  // Dv = D
  DType dtype = DType::kFloat16;
  bool causal = false;
  float scale = 0.125f;
  float softcap = 0.f;  // 0: off
  BroadcastOperand mask;  // uint8_t, or uint32_t words (mask_format)
  BroadcastOperand bias;  // the input dtype
  DmaMaskFormat mask_format = DmaMaskFormat::kBytes;

  // Whether query i of (batch b, query head h) may attend key j by the mask
  // alone (true without one); either format. For the scalar readers (the GPU
  // references); the attention kernels read whole tiles, and the backward's
  // per-score test has its own per-format copy (score_prob's template flag).
  ATTNLAB_HOST_DEVICE bool mask_allows(int b_, int h_, int i, int j) const {
    if (mask.data == nullptr) return true;
    const int64_t at = mask.row_offset(b_, h_, i);
    if (mask_format == DmaMaskFormat::kBits)
      return (static_cast<const uint32_t*>(mask.data)[at + j / 32] >> (j % 32) & 1u) != 0u;
    return static_cast<const uint8_t*>(mask.data)[at + j] != 0;
  }

  // The same problem as a dense AttnProblem (H query heads, Hkv KV heads), for
  // the shared masking helpers, the FLOP count's causal part and the dense rung.
  ATTNLAB_HOST_DEVICE AttnProblem dense() const {
    AttnProblem p;
    p.B = B;
    p.H = H;
    p.Hkv = Hkv;
    p.Nq = Nq;
    p.Nk = Nk;
    p.D = D;
    p.Dv = D;
    p.dtype = dtype;
    p.causal = causal;
    p.scale = scale;
    return p;
  }
  std::string shape_string() const;
};

// Tiles of the forward kernel: the skip test works on Br x Bc blocks.
constexpr int kDmaBr = 64, kDmaBc = 64;

// Whether a tensor's base address is a multiple of `bytes` (the kernels' 16-byte
// copies, TMA bases, paired and vector stores).
inline bool dma_aligned(const void* x, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(x) % bytes == 0; }

// The forward's block order: the query tile that the j-th block (in launch
// order, per head) of n_m computes — the last first (causally the heaviest),
// or, with a mask, from both ends in turn (last, first, last - 1, second, ...)
// because a mask can put its heavy tiles anywhere. A permutation of 0..n_m-1.
ATTNLAB_HOST_DEVICE inline int dma_query_tile_order(int j, int n_m, bool zigzag) {
  return !zigzag ? n_m - 1 - j : (j % 2 == 0 ? n_m - 1 - j / 2 : j / 2);
}

// kWgmma copies K and V by TMA where it can (16-byte aligned bases),
// kWgmmaCpAsync always with cp.async (the comparison, and its tests).
// kGather (automatic for Nq = 1 with a mask): decoding by key, not by tile —
// a block lists its split's active keys and copies only their K and V rows.
enum class DmaCore { kAuto = 0, kMma = 1, kWgmma = 2, kWgmmaCpAsync = 3, kGather = 4 };
// Which core dma_forward runs for this problem and request ("mma", "wgmma",
// "wgmma-cp.async" or "gather"), or "" where the request cannot run (kWgmma
// off Hopper or at another D; kGather with Nq > 1 or without a mask).
std::string dma_forward_core_name(const DynamicMaskProblem& p, DmaCore requested);

// Where the forward reads the mask for its skip test. kPrepass: a pre-pass
// kernel summarises the whole mask into tile bits first (the backward always
// does this), then the forward reads one word per 32 tiles. kInKernel: every
// forward block reads its own query tile's rows of the mask, so the mask is
// streamed while other blocks compute. kAuto: in-kernel when each mask byte is
// read by at most two blocks (the mask is not broadcast over more than two
// heads x batches, nor over the queries of more than one 64-row tile) and a
// block scans at most 16K keys (Nk / splits; 128K for a bit-packed mask),
// else the pre-pass, which reads
// a shared mask once and has every load in flight at once — pipelined
// (below) where it can be and at most two blocks share a mask byte.
// kPipelined: the pre-pass in chunks of query tiles (DmaForwardArgs::
// prepass_chunks), the forward of each chunk launched on a side stream as
// soon as that chunk's bits are written, so that the forward's compute runs
// under the rest of the pre-pass's memory traffic; only with one split and a
// mask that is not broadcast over the queries (else it is the pre-pass).
enum class DmaMaskScan { kAuto = 0, kPrepass = 1, kInKernel = 2, kPipelined = 3 };
// "prepass", "in-kernel", "pipelined", or "none" without a mask, for `splits`
// resolved split-KV parts (dma_resolve_splits) and the `core` requested (the
// gather core always reads its own row: "in-kernel").
std::string dma_forward_mask_scan_name(const DynamicMaskProblem& p, DmaMaskScan requested, int splits = 1,
                                       DmaCore core = DmaCore::kAuto);
// The chunk count a DmaForwardArgs::prepass_chunks of `requested` resolves to
// for the pipelined pre-pass: `requested` (0: kDmaPrepassChunks) capped at
// the query tiles. (2 to 8 chunks perform alike: docs/experiments.md.)
constexpr int kDmaPrepassChunks = 4, kDmaMaxPrepassChunks = 16;
int dma_resolve_prepass_chunks(const DynamicMaskProblem& p, int requested);
// The chunks' query-tile boundaries: chunk c is tiles [bounds[c], bounds[c+1]),
// every chunk at least one tile, each reading about the same number of mask
// bytes — causally not the same tile count (L = 32K, 8 chunks: the first
// holds ~181 of the 512 query tiles, the last ~33).
std::vector<int> dma_prepass_chunk_bounds(const DynamicMaskProblem& p, int chunks);

struct DmaForwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  // Optional: two counters (active tiles, tiles in the causal range), added to
  // by every block; for the harness's "tiles skipped" column.
  unsigned long long* tile_counters = nullptr;
  // Split-KV (decoding): the KV range of every query block is cut into
  // `splits` parts run by separate blocks, their partial results merged by LSE
  // in a second kernel. 0 = automatic (dma_auto_splits), 1 = no split. With
  // more than one split the partials need workspace.
  // `workspace`: dma_forward_workspace_bytes(p, resolved split count) bytes
  // (the mask's tile summary and the split partials; 0 bytes without a mask
  // and without splits).
  int splits = 1;
  float* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The tensor-core path: kAuto = wgmma on an sm_90 GPU (build with sm_90a
  // code) for D in {64, 128}, mma.sync otherwise; kMma / kWgmma force
  // one (kWgmma where it cannot run: cudaErrorInvalidValue).
  DmaCore core = DmaCore::kAuto;
  DmaMaskScan mask_scan = DmaMaskScan::kAuto;
  // kPipelined only: the pre-pass's chunks (0: kDmaPrepassChunks; at most
  // kDmaMaxPrepassChunks), cut so that each reads about the same share of
  // the mask.
  int prepass_chunks = 0;
  // Optional: the tile summary of this same mask, unchanged since it was made
  // (dma_build_mask_summary, or a previous call's dma_forward_mask_summary) —
  // for a mask used more than once (forward after forward, layers or calls
  // sharing it). The forward then scans nothing: mask_scan is ignored and
  // only the active tiles' mask bytes are read. The gather core (decoding)
  // lists its row's keys itself and ignores it. nullptr: scan as mask_scan says.
  const uint32_t* mask_summary = nullptr;
};

// The tile summary of a mask, as the forward's and backward's pre-pass write
// it — one "any" and one "all ones" bit per (mask batch, mask head, 64-query
// tile, 64-key tile) — into `storage` (dma_mask_summary_bytes(p) bytes,
// 4-byte aligned; 0 without a mask), for DmaForwardArgs::mask_summary and
// DmaBackwardArgs::mask_summary.
size_t dma_mask_summary_bytes(const DynamicMaskProblem& p);
cudaError_t dma_build_mask_summary(const DynamicMaskProblem& p, uint32_t* storage, cudaStream_t stream);

// The split count `0 = automatic` resolves to: 1 when the query blocks already
// fill half the GPU's SMs, else enough splits for two blocks per SM (at most
// 128, at least 4 KV tiles each).
int dma_auto_splits(const DynamicMaskProblem& p);
int dma_resolve_splits(const DynamicMaskProblem& p, int requested);
size_t dma_forward_workspace_bytes(const DynamicMaskProblem& p, int splits);

// The mask summary a dma_forward call with these arguments writes into its
// workspace (the tile bits of the mask pre-pass), for the backward to reuse
// (DmaBackwardArgs::mask_summary): non-null where that call runs a pre-pass
// (mask scan "prepass" or "pipelined"), or the in-kernel scan of the tile
// kernel with one split (each summary row stored by one of the blocks that
// scanned it: the same bits), or was given one (DmaForwardArgs::mask_summary:
// then that one); null without a mask, for the gather core and for a split
// in-kernel scan (each block scans part of a row).
const uint32_t* dma_forward_mask_summary(const DynamicMaskProblem& p, const DmaForwardArgs& a);
// The core request a dma_forward call with these arguments runs: a.core,
// except that a short decoding row whose tensors the tile kernels cannot copy
// goes to the gather core (kGather), which copies K and V rows at any alignment.
DmaCore dma_forward_core_request(const DynamicMaskProblem& p, const DmaForwardArgs& a);

// "" when the forward kernel runs this problem on the current device, else why not.
std::string dma_forward_unsupported(const DynamicMaskProblem& p);
cudaError_t dma_forward(const DynamicMaskProblem& p, const DmaForwardArgs& a, cudaStream_t stream);

// Adds to *d_count (device memory) the number of (query, key) pairs over all
// B·H heads that neither the mask nor the causal rule excludes: the `pairs` of
// the FLOP convention (effective TFLOPS count only these).
cudaError_t dma_count_visible_pairs(const DynamicMaskProblem& p, unsigned long long* d_count, cudaStream_t stream);

// ---- backward (dmattn_bwd.cu) ------------------------------------------------
// q, k, v and dout 16-byte aligned (the kernels copy them in 16-byte pieces),
// dq, dk, dv 4-byte aligned; otherwise dma_backward returns
// cudaErrorInvalidValue and launches nothing. o may sit anywhere.
struct DmaBackwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;     // the forward's output
  const float* lse = nullptr;  // the forward's LSE
  const void* dout = nullptr;
  void* dq = nullptr;          // [B,H,Nq,D], input dtype
  void* dk = nullptr;          // [B,Hkv,Nk,D]
  void* dv = nullptr;
  void* dbias = nullptr;       // the bias's own shape, summed over its broadcast dims; may be null
  // dma_backward_workspace_bytes(p, deterministic, q_chunks), 16-byte aligned: accumulators, Δ
  float* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Deterministic: dQ, dK, dV and dBias bitwise identical run to run (no
  // floating-point atomics; a fixed summation order). Slower.
  bool deterministic = false;
  // Query chunks: the walk of each 64-key tile over its (query head, query
  // tile) slots is shared by this many blocks, which add their dK, dV through
  // fp32 atomics (workspace). 0 = automatic (dma_backward_resolve_chunks),
  // 1 = one block per key tile (direct stores, no accumulators), > 1 forced
  // (at most 4096). Ignored in deterministic mode (always 1).
  int q_chunks = 0;
  // The main kernel's tensor-core path, as DmaForwardArgs::core: kAuto = the
  // five products as wgmma on an sm_90 GPU at D in {64, 128}, mma.sync
  // otherwise (the deterministic mode's dQ pass is always mma.sync).
  DmaCore core = DmaCore::kAuto;
  // Optional: the forward's mask summary (dma_forward_mask_summary) for this
  // same problem and mask, still unchanged; the backward then skips its own
  // mask pre-pass (at L = 32K, 538 MB of mask read again). nullptr: it runs
  // its own.
  const uint32_t* mask_summary = nullptr;
  // Each key tile walks its query tiles from its own offset (key tile j: from
  // m_first + j, wrapping), so that blocks running in step reduce dQ into
  // different query tiles: faster on a sparse top-W mask, dense and causal
  // masks unchanged. false: every key tile from m_first (for comparison).
  bool rotate_slots = true;
};
std::string dma_backward_unsupported(const DynamicMaskProblem& p);
// "mma" or "wgmma" for this problem and request; "" where the request cannot run.
std::string dma_backward_core_name(const DynamicMaskProblem& p, DmaCore requested);
// The chunk count a DmaBackwardArgs::q_chunks of `requested` resolves to on the
// current device: 1 in deterministic mode, `requested` when > 0, else the
// automatic rule (dmattn_bwd.cu, next to the definition, gives its reasoning).
int dma_backward_resolve_chunks(const DynamicMaskProblem& p, bool deterministic, int requested);
// Whether dma_backward, with this request, counts every key tile's active
// slots after the mask pass and deals them to one chunk on the device when
// they are spread evenly (the automatic count with a mask, where the key tiles
// alone give every SM 4 blocks; dmattn_bwd.cu: the chunk plan).
bool dma_backward_plans_chunks(const DynamicMaskProblem& p, bool deterministic, int requested);
// The chunk count the last dma_backward with this workspace (and the same
// problem and request) walked: the plan's decision where it planned (after
// that call has finished: a synchronous read of the workspace), else
// dma_backward_resolve_chunks. For reports (the harness's row).
int dma_backward_walked_chunks(const DynamicMaskProblem& p, bool deterministic, int requested, const float* workspace);
// Workspace bytes for dma_backward with the same `deterministic` and `q_chunks`
// (the requested count, resolved as above).
size_t dma_backward_workspace_bytes(const DynamicMaskProblem& p, bool deterministic = false, int q_chunks = 0);
cudaError_t dma_backward(const DynamicMaskProblem& p, const DmaBackwardArgs& a, cudaStream_t stream);

// ---- GPU references and the mask builder (dmattn_reference.cu) --------------
// fp32 reference: o_ref [B,H,Nq,D] fp32, lse_ref [B,H,Nq]. With
// `low_precision`, S (after bias and softcap) and P are rounded to the input
// dtype before use, as an unfused fp16/bf16 implementation would: the baseline
// error the check rule compares against.
cudaError_t dma_reference_fp32(const DynamicMaskProblem& p, const void* q, const void* k, const void* v,
                               float* o_ref, float* lse_ref, bool low_precision, cudaStream_t stream);
// Largest Nk the reference handles (its scores of one row live in shared memory).
int dma_reference_max_nk();

// fp32 reference backward of L = Σ O ⊙ dout: dq [B,H,Nq,D], dk and dv
// [B,Hkv,Nk,D], and, when the problem has a bias and `dbias` is not null, dbias
// in the bias's own (broadcast) shape, summed over the dimensions it is
// broadcast along. All fp32, zeroed here first; dout [B,H,Nq,D] in the input
// dtype. A row that sees no key contributes nothing. For tests (atomics: the
// last bits depend on the order; Nk <= dma_reference_backward_max_nk()).
// With `low_precision`, S (after bias and softcap), P, dP and dS are rounded
// to the input dtype where an unfused fp16/bf16 backward stores them: the
// baseline error of the pass rule (ours <= 2 x baseline + a floor).
cudaError_t dma_reference_backward_fp32(const DynamicMaskProblem& p, const void* q, const void* k, const void* v,
                                        const void* dout, float* dq, float* dk, float* dv, float* dbias,
                                        cudaStream_t stream, bool low_precision = false);
int dma_reference_backward_max_nk();

// The bit-packed form (DmaMaskFormat::kBits) of p's byte mask: `bits_out`
// (dma_mask_bits_bytes(p) bytes, 8-byte aligned) dense in the mask's own
// broadcast shape (mask.b, mask.h, mask.q rows of dma_mask_bit_row_words(Nk)
// words), padding bits 0. One read of the byte mask; for a mask used by more
// than one call (layers, forward and backward) pack it once.
size_t dma_mask_bits_bytes(const DynamicMaskProblem& p);
// "" unless p's mask is bit-packed and not laid out as the kernels read it
// (base 8-byte aligned, strides even word counts); then why not.
std::string dma_mask_bits_unsupported(const DynamicMaskProblem& p);
cudaError_t dma_pack_mask_bits(const DynamicMaskProblem& p, uint32_t* bits_out, cudaStream_t stream);
// p with its mask replaced by that packed copy (same shape; strides in words).
DynamicMaskProblem dma_with_bit_mask(const DynamicMaskProblem& p, const uint32_t* bits);

// flash-dmattn's dynamic mask on the GPU: for every (b, mask head, query) row,
// keep the `window` keys with the largest bias among those the causal rule
// allows (ties: the lower key index); with block_size > 0, then keep a key
// block whole (its causally allowed keys) when more than half of its keys were
// kept, else drop it. The bias is read through p.bias (its broadcast shape);
// the mask written is dense in shape (bias.b, bias.h, Nq, Nk), uint8.
// Matches build_topk_mask_cpu (masked_reference_cpu.h).
cudaError_t dma_build_topk_mask(const DynamicMaskProblem& p, int window, int block_size, uint8_t* mask_out,
                                cudaStream_t stream);

}  // namespace attnlab
