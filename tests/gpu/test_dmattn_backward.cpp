// GPU test (ctest -L gpu): the backward kernel of dynamic-mask attention
// (dma_backward, kernels/dmattn/dmattn_bwd.cu) against the fp32 GPU reference
// backward (dma_reference_backward_fp32, checked against the CPU double
// reference by test_dmattn_backward_reference): dQ, dK, dV and dBias
// separately, fresh random inputs, outputs poisoned with NaN, every head dim the
// kernel takes, GQA, broadcast mask and bias, softcap, causal with Nq != Nk,
// fully masked rows, both dtypes; and the deterministic mode: the same checks,
// plus gradients bitwise identical over 5 runs. Query chunks (several blocks
// per key tile adding dK, dV through atomics): a selection of the cases with
// q_chunks forced to 1, 2, 3, 7 and automatic, including flash-dmattn top-W
// masks (built from the bias on the GPU; with a query-broadcast bias whole key
// tiles are inactive: the skew chunks are for) and chunk counts above the slots;
// with 3 and automatic chunks the backward reads the forward's mask summary
// (its pipelined pre-pass) instead of running its own, and every masked
// deterministic case checks that this gives the same bits. Two large cases
// take the chunk plan (dma_backward_plans_chunks): an even and a skewed mask.
// Pass rule (FlashAttention's tests'): for each gradient
// separately, max |g - g_ref| <= 2 x max |g_lp - g_ref| + 1e-3 x max |g_ref| +
// 1e-4, where g_ref is the fp32 reference and g_lp the same reference with S,
// P, dP and dS rounded to the input dtype (an unfused same-precision backward).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dmattn_cases.h"
#include "gpu_testing.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

// A 16-bit gradient against the fp32 reference gradient, judged against the
// same-precision reference's error.
void compare(const std::string& what, const void* dev, const float* ref_dev, const float* lp_dev, size_t n, DType t) {
  std::vector<uint16_t> got(n);
  std::vector<float> ref(n), lp(n);
  cudaMemcpy(got.data(), dev, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(ref.data(), ref_dev, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lp.data(), lp_dev, n * 4, cudaMemcpyDeviceToHost);
  double err = 0, base = 0, scale = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = from_bits(got[i], t);
    if (!std::isfinite(x)) ++bad;
    else err = std::max(err, std::fabs(x - double(ref[i])));
    base = std::max(base, std::fabs(double(lp[i]) - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  const double tol = 2 * base + 1e-3 * scale + 1e-4;
  char buf[128];
  std::snprintf(buf, sizeof buf, " err %.2e <= %.2e (same-precision err %.2e, max |ref| %.2e, nonfinite %lld)", err,
                tol, base, scale, (long long)bad);
  record(bad == 0 && err <= tol, what + buf);
}

// The raw bytes of a device buffer, to compare runs bit for bit.
std::vector<uint8_t> bytes_of(const void* dev, size_t n) {
  std::vector<uint8_t> h(n);
  cudaMemcpy(h.data(), dev, n, cudaMemcpyDeviceToHost);
  return h;
}

// The main kernel's core for every case (main() runs the suite once per core
// where the automatic one is wgmma).
DmaCore g_core = DmaCore::kAuto;
// DmaBackwardArgs::rotate_slots for every case (main() runs a selection again
// without it: every key tile walking its query tiles in order).
bool g_rotate = true;
// The backward's O at 2 bytes past a 16-byte boundary and dQ at 4 (the
// scalar Δ pass with a memset, the scalar dQ conversion), and a dO 2 bytes
// off, which dma_backward must refuse (its tile copies are 16-byte).
bool g_offset_o_dq = false;
// The kernels given the case's mask bit-packed (DmaMaskFormat::kBits,
// dma_pack_mask_bits); the references keep the byte mask.
bool g_mask_bits = false;

// q_chunks: DmaBackwardArgs::q_chunks (0 automatic). topk_window > 0: the
// case's mask (give it none) is replaced by dma_build_topk_mask's top-W mask of
// the bias (block smoothing 64), dense in the bias's shape (b, h, Nq, Nk).
// reuse: the backward reads the forward's mask summary
// (DmaBackwardArgs::mask_summary) instead of running its own pre-pass — a
// forward that runs its pipelined pre-pass (the plain one where that does not
// apply), or its in-kernel scan, which stores the same bits as it goes.
enum class Reuse { kNone, kPipelined, kInKernel };
void run_case(const MaskedCase& c, uint64_t seed, bool deterministic = false, int q_chunks = 0,
              int topk_window = 0, Reuse reuse = Reuse::kNone) {
  const bool reuse_summary = reuse != Reuse::kNone;
  MaskedCaseInputs x(c, seed);
  DynamicMaskProblem p = x.p;
  void* const d_bias = x.d_bias;
  uint8_t* d_topk = nullptr;
  if (topk_window > 0) {
    const size_t n = size_t(p.bias.b) * p.bias.h * c.Nq * c.Nk;
    cudaMalloc(&d_topk, n);
    if (dma_build_topk_mask(p, topk_window, 64, d_topk, 0) != cudaSuccess) {
      record(false, "dma_build_topk_mask failed: " + c.name());
      cudaFree(d_topk);
      return;
    }
    p.mask.data = d_topk;
    p.mask.set_shape(p.bias.b, p.bias.h, c.Nq, c.Nk, c.H);
  }
  const std::string why = dma_backward_unsupported(p);
  if (!why.empty()) {
    record(false, "unsupported: " + why);
    if (d_topk) cudaFree(d_topk);
    return;
  }
  // pk: the problem the kernels run — p, or p with its mask bit-packed.
  uint32_t* d_bits = nullptr;
  DynamicMaskProblem pk = p;
  if (g_mask_bits && p.mask.data != nullptr) {
    cudaMalloc(&d_bits, dma_mask_bits_bytes(p));
    if (dma_pack_mask_bits(p, d_bits, 0) != cudaSuccess) record(false, "dma_pack_mask_bits failed: " + c.name());
    pk = dma_with_bit_mask(p, d_bits);
  }
  const size_t q_n = size_t(c.B) * c.H * c.Nq * c.D, kv_n = size_t(c.B) * c.Hkv * c.Nk * c.D;
  const size_t rows = size_t(c.B) * c.H * c.Nq, bias_n = c.bb > 0 ? size_t(p.bias.elems(c.Nk)) : 0;
  void* d_q = upload(x.qb);
  void* d_k = upload(x.kb);
  void* d_v = upload(x.vb);
  void* d_do = upload(x.db);
  void *d_o = nullptr, *d_dq = nullptr, *d_dk = nullptr, *d_dv = nullptr, *d_db = nullptr;
  float *d_lse = nullptr, *d_ws = nullptr, *r_dq = nullptr, *r_dk = nullptr, *r_dv = nullptr, *r_db = nullptr;
  float *l_dq = nullptr, *l_dk = nullptr, *l_dv = nullptr, *l_db = nullptr;  // the same-precision reference
  void *d_o_off = nullptr, *d_dq_base = nullptr;  // g_offset_o_dq: O's copy at +2 bytes, dQ at +4
  cudaMalloc(&d_o, q_n * 2);
  cudaMalloc(&d_o_off, q_n * 2 + 16);
  cudaMalloc(&d_lse, rows * 4);
  cudaMalloc(&d_dq_base, q_n * 2 + 16);
  d_dq = static_cast<char*>(d_dq_base) + (g_offset_o_dq ? 4 : 0);
  cudaMalloc(&d_dk, kv_n * 2);
  cudaMalloc(&d_dv, kv_n * 2);
  cudaMalloc(&d_db, std::max<size_t>(1, bias_n) * 2);
  cudaMalloc(&r_dq, q_n * 4);
  cudaMalloc(&r_dk, kv_n * 4);
  cudaMalloc(&r_dv, kv_n * 4);
  cudaMalloc(&r_db, std::max<size_t>(1, bias_n) * 4);
  cudaMalloc(&l_dq, q_n * 4);
  cudaMalloc(&l_dk, kv_n * 4);
  cudaMalloc(&l_dv, kv_n * 4);
  cudaMalloc(&l_db, std::max<size_t>(1, bias_n) * 4);
  const size_t ws = dma_backward_workspace_bytes(p, deterministic, q_chunks);
  cudaMalloc(&d_ws, ws);
  cudaMemset(d_dq, 0xFF, q_n * 2);  // NaN poison: every gradient must be written
  cudaMemset(d_dk, 0xFF, kv_n * 2);
  cudaMemset(d_dv, 0xFF, kv_n * 2);
  cudaMemset(d_db, 0xFF, std::max<size_t>(1, bias_n) * 2);
  DmaForwardArgs fa;
  fa.q = d_q; fa.k = d_k; fa.v = d_v; fa.o = d_o; fa.lse = d_lse;
  DmaBackwardArgs ba;
  ba.q = d_q; ba.k = d_k; ba.v = d_v; ba.o = d_o; ba.lse = d_lse; ba.dout = d_do;
  ba.dq = d_dq; ba.dk = d_dk; ba.dv = d_dv; ba.dbias = d_bias ? d_db : nullptr;
  ba.workspace = d_ws; ba.workspace_bytes = ws;
  ba.deterministic = deterministic;
  ba.q_chunks = q_chunks;
  ba.core = g_core;
  ba.rotate_slots = g_rotate;
  float* d_fws = nullptr;  // the forward's workspace (the mask summary)
  if (const size_t fws = dma_forward_workspace_bytes(p, 1); fws > 0) {
    cudaMalloc(&d_fws, fws);
    cudaMemset(d_fws, 0xab, fws);  // poison: a summary word the forward does not write fails the backward
    fa.workspace = d_fws;
    fa.workspace_bytes = fws;
  }
  if (reuse_summary) {
    fa.mask_scan = reuse == Reuse::kInKernel ? DmaMaskScan::kInKernel : DmaMaskScan::kPipelined;
    fa.prepass_chunks = 3;
    ba.mask_summary = dma_forward_mask_summary(pk, fa);
    if (p.mask.data != nullptr && ba.mask_summary == nullptr) record(false, "no forward summary: " + c.name());
  }
  cudaError_t e = dma_forward(pk, fa, 0);
  if (e == cudaSuccess && g_offset_o_dq) {
    void* o_off = static_cast<char*>(d_o_off) + 2;
    e = cudaMemcpy(o_off, d_o, q_n * 2, cudaMemcpyDeviceToDevice);
    ba.o = o_off;
    DmaBackwardArgs bad = ba;  // dO 2 bytes off 16: refused, nothing launched
    void* do_off = static_cast<char*>(d_o_off) + 2;
    bad.dout = do_off;
    const cudaError_t r = dma_backward(pk, bad, 0);
    record(r == cudaErrorInvalidValue, std::string("a dO not 16-byte aligned is refused (") + cudaGetErrorString(r) +
                                           "): " + c.name());
  }
  if (e == cudaSuccess) e = dma_backward(pk, ba, 0);
  if (e == cudaSuccess)
    e = dma_reference_backward_fp32(p, d_q, d_k, d_v, d_do, r_dq, r_dk, r_dv, d_bias ? r_db : nullptr, 0);
  if (e == cudaSuccess)
    e = dma_reference_backward_fp32(p, d_q, d_k, d_v, d_do, l_dq, l_dk, l_dv, d_bias ? l_db : nullptr, 0,
                                    /*low_precision=*/true);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  const std::string name = c.name() + (topk_window > 0 ? " topk " + std::to_string(topk_window) : "") +
                           (deterministic ? " deterministic" : "") + " q_chunks " + std::to_string(q_chunks) +
                           " (resolved " + std::to_string(dma_backward_resolve_chunks(p, deterministic, q_chunks)) +
                           ") core " + dma_backward_core_name(p, g_core) +
                           (reuse == Reuse::kPipelined ? " forward's summary (pre-pass)"
                            : reuse == Reuse::kInKernel ? " forward's summary (in-kernel scan)" : "") + (g_rotate ? "" : " query tiles in order") +
                           (g_offset_o_dq ? " O at +2 bytes, dQ at +4" : "") +
                           (d_bits ? " bit-packed mask" : "");
  if (e != cudaSuccess) {
    record(false, std::string("CUDA error ") + cudaGetErrorString(e) + ": " + name);
    cudaGetLastError();
  } else {
    compare(std::string("dQ ") + name, d_dq, r_dq, l_dq, q_n, c.dtype);
    compare(std::string("dK ") + name, d_dk, r_dk, l_dk, kv_n, c.dtype);
    compare(std::string("dV ") + name, d_dv, r_dv, l_dv, kv_n, c.dtype);
    if (d_bias) compare(std::string("dBias ") + name, d_db, r_db, l_db, bias_n, c.dtype);
    if (deterministic) {  // 4 more runs, each bit for bit the first
      const std::vector<uint8_t> dq0 = bytes_of(d_dq, q_n * 2), dk0 = bytes_of(d_dk, kv_n * 2),
                                 dv0 = bytes_of(d_dv, kv_n * 2), db0 = bytes_of(d_db, bias_n * 2);
      bool same = true;
      for (int run = 1; run < 5 && e == cudaSuccess; ++run) {
        cudaMemset(d_dq, 0xFF, q_n * 2);
        cudaMemset(d_dk, 0xFF, kv_n * 2);
        cudaMemset(d_dv, 0xFF, kv_n * 2);
        cudaMemset(d_db, 0xFF, std::max<size_t>(1, bias_n) * 2);
        e = dma_backward(pk, ba, 0);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        same = same && bytes_of(d_dq, q_n * 2) == dq0 && bytes_of(d_dk, kv_n * 2) == dk0 &&
               bytes_of(d_dv, kv_n * 2) == dv0 && bytes_of(d_db, bias_n * 2) == db0;
      }
      record(e == cudaSuccess && same, "bitwise identical over 5 runs: " + name);
      if (p.mask.data != nullptr && !reuse_summary && e == cudaSuccess) {
        // The forward and the backward again on `problem` (fa, ba as set),
        // the gradients and the forward's workspace poisoned first: whether
        // every gradient is bit for bit the first run's.
        auto rerun_same_bits = [&](const DynamicMaskProblem& problem) {
          cudaMemset(d_fws, 0xab, dma_forward_workspace_bytes(p, 1));  // poison: the forward writes it
          cudaMemset(d_dq, 0xFF, q_n * 2);
          cudaMemset(d_dk, 0xFF, kv_n * 2);
          cudaMemset(d_dv, 0xFF, kv_n * 2);
          cudaMemset(d_db, 0xFF, std::max<size_t>(1, bias_n) * 2);
          e = dma_forward(problem, fa, 0);
          if (e == cudaSuccess) e = dma_backward(problem, ba, 0);
          if (e == cudaSuccess) e = cudaDeviceSynchronize();
          return e == cudaSuccess && bytes_of(d_dq, q_n * 2) == dq0 && bytes_of(d_dk, kv_n * 2) == dk0 &&
                 bytes_of(d_dv, kv_n * 2) == dv0 && bytes_of(d_db, bias_n * 2) == db0;
        };
        // Once more with the forward's summary (a pre-pass forward, then one
        // with the in-kernel scan, each followed by the backward without its
        // own pre-pass): the same bits.
        for (DmaMaskScan scan : {DmaMaskScan::kPrepass, DmaMaskScan::kInKernel}) {
          fa.mask_scan = scan;
          ba.mask_summary = dma_forward_mask_summary(pk, fa);
          record(ba.mask_summary != nullptr && rerun_same_bits(pk),
                 std::string("bitwise identical with the forward's mask summary (") +
                     (scan == DmaMaskScan::kPrepass ? "pre-pass" : "in-kernel scan") + "): " + name);
          ba.mask_summary = nullptr;
        }
        // And with the mask bit-packed: its own pre-pass, then the forward's
        // in-kernel scan's summary — the same bits as the byte mask's.
        if (d_bits == nullptr) {
          uint32_t* d_packed = nullptr;
          cudaMalloc(&d_packed, dma_mask_bits_bytes(p));
          cudaMemset(d_packed, 0xFF, dma_mask_bits_bytes(p));
          const DynamicMaskProblem pb = dma_with_bit_mask(p, d_packed);
          e = dma_pack_mask_bits(p, d_packed, 0);
          for (int with_summary = 0; with_summary < 2 && e == cudaSuccess; ++with_summary) {
            fa.mask_scan = DmaMaskScan::kInKernel;
            ba.mask_summary = with_summary ? dma_forward_mask_summary(pb, fa) : nullptr;
            record(rerun_same_bits(pb), std::string("bit-packed mask: bitwise identical to the byte mask's (") +
                       (with_summary ? "the forward's in-kernel summary" : "its own pre-pass") + "): " + name);
            ba.mask_summary = nullptr;
          }
          cudaFree(d_packed);
        }
      }
    }
  }
  if (d_bits) cudaFree(d_bits);
  if (d_fws) cudaFree(d_fws);
  if (d_topk) cudaFree(d_topk);
  for (void* ptr : {d_o, d_o_off, d_dq_base, static_cast<void*>(d_lse), d_dk, d_dv, d_db, static_cast<void*>(d_ws),
                    static_cast<void*>(r_dq), static_cast<void*>(r_dk), static_cast<void*>(r_dv),
                    static_cast<void*>(r_db), static_cast<void*>(l_dq), static_cast<void*>(l_dk),
                    static_cast<void*>(l_dv), static_cast<void*>(l_db)})
    cudaFree(ptr);
  for (void* ptr : {d_q, d_k, d_v, d_do})
    if (ptr) cudaFree(ptr);
}

}  // namespace

int main() {
  if (!have_gpu()) return kSkipped;
  // The whole suite on the automatic core, and again on mma.sync where the
  // automatic one is wgmma (sm_90, D = 64 and 128): both cores checked alike.
  DynamicMaskProblem shape;
  shape.D = 64;
  std::vector<DmaCore> cores = {DmaCore::kAuto};
  if (dma_backward_core_name(shape, DmaCore::kAuto) == "wgmma") cores.push_back(DmaCore::kMma);
  for (DmaCore core : cores) {
    g_core = core;
    uint64_t seed = 4242;
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true}) {
        for (int D : {32, 64, 96, 128})  // flash-dmattn's shape: GQA, mask per KV head, bias (1, Hkv, 1, Nk)
          run_case({1, 4, 2, 129, 200, D, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed);
        run_case({2, 2, 2, 200, 70, 64, dt, causal, 0.f, 1, 0, 200, 2, 0, 200, false}, ++seed);  // Nq > Nk; per-query bias
        run_case({1, 4, 1, 100, 300, 128, dt, causal, 15.f, 1, 0, 100, 1, 1, 1, true}, ++seed);  // MQA, softcap, zero rows
        run_case({2, 2, 1, 17, 1000, 96, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed);    // no mask
        run_case({1, 2, 2, 1000, 17, 64, dt, causal, 0.f, 0, 0, 0, 0, 0, 0, false}, ++seed);    // neither
        // Deterministic mode: flash-dmattn's shape, and every bias broadcast that
        // makes blocks share a dBias element (over the batch, over KV heads,
        // per-query and per-key forms), softcap and fully masked rows.
        run_case({1, 4, 2, 129, 200, 64, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed, true);
        run_case({2, 4, 2, 130, 77, 128, dt, causal, 0.f, 1, 1, 130, 1, 1, 1, false}, ++seed, true);
        run_case({2, 4, 4, 65, 190, 32, dt, causal, 0.f, 2, 0, 65, 1, 1, 65, false}, ++seed, true);
        run_case({2, 4, 1, 100, 300, 96, dt, causal, 15.f, 1, 0, 100, 2, 0, 100, true}, ++seed, true);
        run_case({2, 4, 2, 130, 77, 128, dt, causal, 0.f, 1, 1, 130, 1, 1, 1, false}, ++seed, true, 7);  // ignored: 1
        // Query chunks: forced 1, 2, 3, 7 and automatic (0), each against the same rule.
        for (int chunks : {1, 2, 3, 7, 0}) {
          // With the forward's summary: from its pre-pass (3, 0), its in-kernel scan (1, 2).
          const Reuse reuse = chunks == 3 || chunks == 0 ? Reuse::kPipelined
                              : chunks == 7             ? Reuse::kNone
                                                        : Reuse::kInKernel;
          // Ragged sizes, GQA, mask per KV head, bias (1, Hkv, 1, Nk) (stride_q 0).
          run_case({1, 4, 2, 129, 200, 64, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed, false, chunks, 0, reuse);
          // Top-W of a query-broadcast bias (1, 1, 1, Nk), W = Nk/2 with 64-key smoothing:
          // whole key tiles inactive for every query tile (about half of them; the
          // active ones in columns), the skew chunks are for.
          run_case({1, 4, 2, 600, 700, 64, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed, false, chunks, 350, reuse);
          // Top-W of a full-rank bias (B, H, Nq, Nk): per-query dBias atomics; inactive
          // tiles only under the causal rule.
          run_case({2, 2, 1, 333, 260, 128, dt, causal, 0.f, 0, 0, 0, 2, 0, 333, false}, ++seed, false, chunks, 130, reuse);
          // MQA, softcap, fully masked rows.
          run_case({1, 4, 1, 100, 300, 128, dt, causal, 15.f, 1, 0, 100, 1, 1, 1, true}, ++seed, false, chunks, 0, reuse);
          // No mask, 1 query tile per head: 2 slots per key tile, fewer than 3 or 7 chunks.
          run_case({2, 2, 1, 17, 1000, 96, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed, false, chunks);
          run_case({1, 2, 2, 1000, 17, 32, dt, causal, 0.f, 0, 0, 0, 0, 0, 0, false}, ++seed, false, chunks);
        }
        // The chunk plan (automatic count with a mask, where the key tiles alone
        // give every SM 4 blocks: 10 x 2 x 35 = 700 here, up to 175 SMs): the
        // device deals a key tile's slots to one chunk when the mask pass finds
        // them even — the random half-dense mask, every tile active — and keeps
        // the chunks when not — the top-W mask of a query-broadcast bias
        // (W = Nk/2: whole key tiles inactive). Causal at Nq ~ Nk skips the plan
        // (its causal range alone is uneven): those two run without it.
        const MaskedCase dense_plan{10, 2, 2, 2100, 2200, 64, dt, causal, 0.f, 1, -1, 2100, 1, -1, 1, false};
        const MaskedCase skewed_plan{10, 2, 2, 2100, 2200, 128, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false};
        DynamicMaskProblem plan_shape;
        plan_shape.B = 10; plan_shape.H = plan_shape.Hkv = 2; plan_shape.Nq = 2100; plan_shape.Nk = 2200;
        plan_shape.D = 64;
        const uint8_t any_mask = 1;
        plan_shape.mask.data = &any_mask;  // only its presence is read
        record(dma_backward_plans_chunks(plan_shape, false, 0),
               "the chunk plan applies (key tile blocks >= 4 per SM): " + dense_plan.name());
        run_case(dense_plan, ++seed);
        run_case(skewed_plan, ++seed, false, 0, 1100, Reuse::kPipelined);
        // Every key tile walking its query tiles in order (rotate_slots off;
        // the suite above runs the default, rotated walk): one chunk, 3
        // chunks, automatic (with the plan), the deterministic mode; GQA,
        // causal with Nq != Nk, top-W, zero rows.
        g_rotate = false;
        for (int chunks : {1, 3, 0}) {
          run_case({1, 4, 2, 129, 200, 64, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed, false, chunks);
          run_case({1, 4, 2, 600, 700, 128, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed, false, chunks, 350, Reuse::kPipelined);
          run_case({1, 4, 1, 100, 300, 128, dt, causal, 15.f, 1, 0, 100, 1, 1, 1, true}, ++seed, false, chunks);
        }
        run_case({2, 4, 2, 130, 77, 128, dt, causal, 0.f, 1, 1, 130, 1, 1, 1, false}, ++seed, true);
        run_case(dense_plan, ++seed);
        g_rotate = true;
        // O and dQ off their 16-byte boundaries (plain, chunked, deterministic).
        g_offset_o_dq = true;
        run_case({1, 4, 2, 129, 200, 64, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed);
        run_case({1, 4, 1, 100, 300, 128, dt, causal, 15.f, 1, 0, 100, 1, 1, 1, true}, ++seed, false, 3);
        run_case({2, 4, 2, 130, 77, 128, dt, causal, 0.f, 1, 1, 130, 1, 1, 1, false}, ++seed, true);
        g_offset_o_dq = false;
        // The kernels on the bit-packed mask (non-deterministic: against the
        // reference; every masked deterministic case above compares it bit for
        // bit): GQA with a per-KV-head mask, zero rows and softcap, top-W with
        // query chunks and the forward's summaries (pre-pass, in-kernel).
        g_mask_bits = true;
        run_case({1, 4, 2, 129, 200, 64, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed);
        run_case({1, 4, 1, 100, 300, 128, dt, causal, 15.f, 1, 0, 100, 1, 1, 1, true}, ++seed, false, 3, 0,
                 Reuse::kInKernel);
        run_case({1, 4, 2, 600, 700, 64, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed, false, 0, 350,
                 Reuse::kPipelined);
        run_case({2, 2, 1, 333, 260, 128, dt, causal, 0.f, 0, 0, 0, 2, 0, 333, false}, ++seed, false, 2, 130,
                 Reuse::kInKernel);
        run_case({1, 4, 2, 129, 200, 96, dt, causal, 0.f, 1, -1, 1, 1, -1, 1, false}, ++seed);  // query-broadcast mask
        g_mask_bits = false;
      }
  }
  return finish();
}
