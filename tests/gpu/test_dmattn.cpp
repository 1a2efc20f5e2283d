// GPU tests of dynamic-mask attention, ctest -L gpu:
//   - the forward kernel against the CPU double reference (masked_reference_cpu)
//     over odd sizes, Nq != Nk, GQA, every broadcast form of mask and bias,
//     fully masked rows, softcap, causal, both dtypes, every head dim; outputs
//     poisoned with NaN first; pass rule: err <= 2 x (error of the same-precision
//     unfused path, dma_reference_fp32(low_precision)) + 2 x output rounding,
//     LSE within 1e-3, -inf exactly where the reference row sees no key;
//   - tiles are really skipped (the kernel's own counters) on a sparse mask;
//   - the GPU top-W mask builder equals the CPU one bit for bit;
//   - the GPU pair count equals the CPU one;
//   - negative control: a corrupted output fails the same rule.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dmattn/dmattn.h"
#include "reference/masked_reference_cpu.h"
#include "gpu_testing.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

struct Case {
  int B, H, Hkv, Nq, Nk, D;
  DType dtype;
  bool causal;
  float softcap;
  // mask / bias shapes: 0 = absent; else sizes (b, h, q) with h given as
  // 'H', 'K' (Hkv) or 1.
  bool mask, bias;
  int mb, mh, mq;  // mh: 0 = H, -1 = Hkv, 1 = 1
  int bb, bh, bq;
  double keep = 0.4;        // random mask density
  int band_from = 0;        // the all-zero band (a quarter of the 64-key tiles) starts at this key
  bool zero_rows = false;   // some fully masked rows
  bool kv_misaligned = false;  // K and V 8 bytes past a 16-byte boundary (no 16-byte copies)
  int topk_window = 0;      // > 0: mask = top-W of the bias (CPU builder), block-smoothed by 64
  int splits = 1;           // split-KV parts (0: automatic)
  DmaCore core = DmaCore::kAuto;  // the tensor-core path (auto: wgmma on sm_90 for D in {64, 128})
  DmaMaskScan mask_scan = DmaMaskScan::kAuto;  // where the forward reads the mask for its skip test
  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "B=%d H=%d Hkv=%d Nq=%d Nk=%d D=%d %s%s%s mask=%s bias=%s%s%s", B, H, Hkv, Nq,
                  Nk, D, dtype == DType::kFloat16 ? "fp16" : "bf16", causal ? " causal" : "",
                  softcap > 0 ? " softcap" : "",
                  mask ? (std::to_string(mb) + "," + std::to_string(mh) + "," + std::to_string(mq)).c_str() : "none",
                  bias ? (std::to_string(bb) + "," + std::to_string(bh) + "," + std::to_string(bq)).c_str() : "none",
                  zero_rows ? " zero-rows" : "", topk_window > 0 ? (" topk " + std::to_string(topk_window)).c_str() : "");
    std::string s = buf;
    if (kv_misaligned) s += " kv+8B";
    if (splits != 1) s += " splits=" + std::to_string(splits);
    if (core == DmaCore::kMma) s += " core=mma";
    if (core == DmaCore::kWgmmaCpAsync) s += " core=wgmma-cp.async";
    if (core == DmaCore::kWgmma) s += " core=wgmma";
    if (core == DmaCore::kGather) s += " core=gather";
    if (mask_scan == DmaMaskScan::kPrepass) s += " scan=prepass";
    if (mask_scan == DmaMaskScan::kInKernel) s += " scan=in-kernel";
    if (mask_scan == DmaMaskScan::kPipelined) s += " scan=pipelined(3)";
    if (keep != 0.4) s += " keep=" + std::to_string(keep).substr(0, 6);
    if (band_from != 0) s += " band from " + std::to_string(band_from);
    return s;
  }
};

int heads_of(int code, const Case& c) { return code == 0 ? c.H : code == -1 ? c.Hkv : 1; }

void run_case(const Case& c, uint64_t seed, bool corrupt = false) {
  std::mt19937_64 rng(seed);
  DynamicMaskProblem p;
  p.B = c.B; p.H = c.H; p.Hkv = c.Hkv; p.Nq = c.Nq; p.Nk = c.Nk; p.D = c.D;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.scale = 1.0f / std::sqrt(float(c.D));
  p.softcap = c.softcap;

  MaskedProblem mp;
  mp.B = c.B; mp.H = c.H; mp.Hkv = c.Hkv; mp.Nq = c.Nq; mp.Nk = c.Nk; mp.D = c.D; mp.Dv = c.D;
  mp.causal = c.causal;
  mp.scale = p.scale;
  mp.softcap = c.softcap;

  MaskedInputs in;
  std::vector<uint16_t> qb, kb, vb, biasb;
  random_tensor(rng, int64_t(c.B) * c.H * c.Nq * c.D, c.dtype, 1.0, qb, in.q);
  random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, c.dtype, 1.0, kb, in.k);
  random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, c.dtype, 1.0, vb, in.v);

  void* d_bias = nullptr;
  if (c.bias || c.topk_window > 0) {
    mp.has_bias = true;
    mp.bias_shape = {c.bb, heads_of(c.bh, c), c.bq, c.Nk};
    random_tensor(rng, mp.bias_shape.elems(), c.dtype, 2.0, biasb, in.bias);
    d_bias = upload(biasb);
    p.bias.data = d_bias;
    p.bias.set_shape(c.bb, heads_of(c.bh, c), c.bq, c.Nk, c.H);
  }
  uint8_t* d_mask = nullptr;
  if (c.topk_window > 0) {
    mp.has_mask = true;
    in.mask = build_topk_mask_cpu(mp, in.bias, c.topk_window, 64);
    mp.mask_shape = {mp.bias_shape.b, mp.bias_shape.h, c.Nq, c.Nk};
    // The GPU builder must produce the same bits.
    uint8_t* d_built = nullptr;
    cudaMalloc(&d_built, size_t(mp.mask_shape.elems()));
    const cudaError_t e = dma_build_topk_mask(p, c.topk_window, 64, d_built, 0);
    std::vector<uint8_t> built(size_t(mp.mask_shape.elems()));
    cudaMemcpy(built.data(), d_built, built.size(), cudaMemcpyDeviceToHost);
    record(e == cudaSuccess && built == in.mask, "topk builder GPU == CPU: " + c.name());
    d_mask = d_built;
    p.mask.data = d_mask;
    p.mask.set_shape(mp.mask_shape.b, mp.mask_shape.h, c.Nq, c.Nk, c.H);
  } else if (c.mask) {
    mp.has_mask = true;
    mp.mask_shape = {c.mb, heads_of(c.mh, c), c.mq, c.Nk};
    in.mask.resize(size_t(mp.mask_shape.elems()));
    std::bernoulli_distribution keep(c.keep);
    for (auto& m : in.mask) m = keep(rng) ? 1 : 0;
    // A sparse band: a quarter of the 64-key tiles are all zero, so skipping
    // has work to do (from key band_from on: dense before it).
    for (int64_t r = 0; r < mp.mask_shape.elems() / c.Nk; ++r)
      for (int j = c.band_from; j < c.Nk; ++j)
        if ((j / 64) % 4 == 1) in.mask[size_t(r * c.Nk + j)] = 0;
    if (c.zero_rows && c.mq > 1)
      for (int64_t r = 0; r < mp.mask_shape.elems() / c.Nk; r += 3)
        std::fill(in.mask.begin() + r * c.Nk, in.mask.begin() + (r + 1) * c.Nk, 0);
    d_mask = upload(in.mask);
    p.mask.data = d_mask;
    p.mask.set_shape(c.mb, heads_of(c.mh, c), c.mq, c.Nk, c.H);
  }

  const std::string why = dma_forward_unsupported(p);
  if (!why.empty()) {
    record(false, "unsupported (" + why + "): " + c.name());
    return;
  }

  // CPU double reference.
  std::vector<double> o_ref, lse_ref;
  masked_attention_forward_cpu(mp, in, o_ref, lse_ref);

  void* d_q = upload(qb);
  void* d_k = upload(kb);
  void* d_v = upload(vb);
  void* kv_bases[2] = {nullptr, nullptr};  // the allocations behind misaligned K, V
  if (c.kv_misaligned) {
    const std::vector<uint16_t>* src[2] = {&kb, &vb};
    void** dst[2] = {&d_k, &d_v};
    for (int i = 0; i < 2; ++i) {
      cudaFree(*dst[i]);
      cudaMalloc(&kv_bases[i], src[i]->size() * 2 + 16);
      *dst[i] = static_cast<char*>(kv_bases[i]) + 8;
      cudaMemcpy(*dst[i], src[i]->data(), src[i]->size() * 2, cudaMemcpyHostToDevice);
    }
  }
  const int64_t o_elems = int64_t(c.B) * c.H * c.Nq * c.D, rows = int64_t(c.B) * c.H * c.Nq;
  void* d_o = nullptr;
  float* d_lse = nullptr;
  float* d_olp = nullptr;
  float* d_lselp = nullptr;
  unsigned long long* d_counters = nullptr;
  cudaMalloc(&d_o, size_t(o_elems) * 2);
  cudaMalloc(&d_lse, size_t(rows) * 4);
  cudaMalloc(&d_olp, size_t(o_elems) * 4);
  cudaMalloc(&d_lselp, size_t(rows) * 4);
  cudaMalloc(&d_counters, 3 * sizeof(unsigned long long));
  cudaMemset(d_o, 0xFF, size_t(o_elems) * 2);  // NaN poison
  cudaMemset(d_lse, 0xFF, size_t(rows) * 4);
  cudaMemset(d_counters, 0, 3 * sizeof(unsigned long long));

  DmaForwardArgs a;
  a.q = d_q; a.k = d_k; a.v = d_v; a.o = d_o; a.lse = d_lse;
  a.tile_counters = d_counters;
  a.splits = dma_resolve_splits(p, c.splits);
  a.core = c.core;
  a.mask_scan = c.mask_scan;
  a.prepass_chunks = 3;  // pipelined: three chunks (an odd count, a middle chunk), as many as there are query tiles
  float* d_ws = nullptr;
  if (dma_forward_workspace_bytes(p, a.splits) > 0) {  // the mask summary and/or the split partials
    a.workspace_bytes = dma_forward_workspace_bytes(p, a.splits);
    cudaMalloc(&d_ws, a.workspace_bytes);
    cudaMemset(d_ws, 0xFF, a.workspace_bytes);  // NaN: a partial the combine reads unwritten shows up
    a.workspace = d_ws;
  }
  cudaError_t e = dma_forward(p, a, 0);
  if (c.kv_misaligned) {  // the tile kernels say no (16-byte copies) instead of faulting
    DmaForwardArgs tile = a;
    tile.core = DmaCore::kMma;
    record(dma_forward(p, tile, 0) == cudaErrorInvalidValue, "tile kernel refuses misaligned K, V: " + c.name());
  }
  if (e == cudaSuccess) e = dma_reference_fp32(p, d_q, d_k, d_v, d_olp, d_lselp, /*low_precision=*/true, 0);
  if (e == cudaSuccess) e = dma_count_visible_pairs(p, d_counters + 2, 0);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    record(false, std::string("CUDA error ") + cudaGetErrorString(e) + ": " + c.name());
    cudaGetLastError();
    return;
  }
  std::vector<uint16_t> ob(static_cast<size_t>(o_elems));
  std::vector<float> lse(static_cast<size_t>(rows)), olp(static_cast<size_t>(o_elems));
  unsigned long long counters[3];
  cudaMemcpy(ob.data(), d_o, ob.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(olp.data(), d_olp, olp.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(counters, d_counters, sizeof counters, cudaMemcpyDeviceToHost);
  if (corrupt) ob[size_t(o_elems / 2)] = to_bits(from_bits(ob[size_t(o_elems / 2)], c.dtype) + 0.05, c.dtype);

  // The pass rule on an output (ob, lse) against the fp32 reference.
  auto judge = [&](const std::vector<uint16_t>& ob, const std::vector<float>& lse, std::string* msg_out) {
    double err = 0, base = 0, rounding = 0, lse_err = 0;
    int64_t bad = 0;
    const double ulp = c.dtype == DType::kFloat16 ? 1.0 / 2048 : 1.0 / 256;
    for (int64_t i = 0; i < o_elems; ++i) {
      const double x = from_bits(ob[size_t(i)], c.dtype);
      if (!std::isfinite(x)) { ++bad; continue; }
      err = std::max(err, std::fabs(x - o_ref[size_t(i)]));
      base = std::max(base, std::fabs(double(olp[size_t(i)]) - o_ref[size_t(i)]));
      rounding = std::max(rounding, std::fabs(o_ref[size_t(i)]) * ulp / 2);
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isinf(lse_ref[size_t(r)])) {
        if (!(std::isinf(lse[size_t(r)]) && lse[size_t(r)] < 0)) ++bad;
      } else if (!std::isfinite(lse[size_t(r)])) {
        ++bad;
      } else {
        lse_err = std::max(lse_err, std::fabs(double(lse[size_t(r)]) - lse_ref[size_t(r)]));
      }
    }
    const double tol = 2 * base + 2 * rounding + 1e-6;
    char msg[200];
    std::snprintf(msg, sizeof msg, "err %.2e tol %.2e lse %.1e bad %lld tiles %llu/%llu: ", err, tol, lse_err,
                  (long long)bad, counters[0], counters[1]);
    *msg_out = msg;
    return bad == 0 && err <= tol && lse_err <= 1e-3;
  };
  std::string msg;
  const bool ok = judge(ob, lse, &msg);
  if (corrupt) record(!ok, std::string("negative control detected: ") + msg + c.name());
  else record(ok, msg + c.name());

  // The same forward given the mask's summary (DmaForwardArgs::mask_summary,
  // built by dma_build_mask_summary into storage poisoned with ones — a tile
  // whose bits it failed to write would then count as active and all ones):
  // no scan, the same pass rule, and the same bits as the scanning run.
  if (!corrupt && c.mask && dma_forward_core_name(p, c.core) != "gather" && !c.kv_misaligned) {
    uint32_t* d_summary = nullptr;
    cudaMalloc(&d_summary, dma_mask_summary_bytes(p) + 16);
    cudaMemset(d_summary, 0xFF, dma_mask_summary_bytes(p) + 16);
    cudaMemset(d_o, 0xFF, size_t(o_elems) * 2);
    cudaMemset(d_lse, 0xFF, size_t(rows) * 4);
    DmaForwardArgs given = a;
    given.tile_counters = nullptr;
    given.mask_summary = d_summary;
    cudaError_t e2 = dma_build_mask_summary(p, d_summary, 0);
    if (e2 == cudaSuccess) e2 = dma_forward(p, given, 0);
    if (e2 == cudaSuccess) e2 = cudaDeviceSynchronize();
    if (e2 != cudaSuccess) {
      record(false, std::string("CUDA error ") + cudaGetErrorString(e2) + " (summary given): " + c.name());
      cudaGetLastError();
    } else {
      std::vector<uint16_t> ob2(ob.size());
      std::vector<float> lse2(lse.size());
      cudaMemcpy(ob2.data(), d_o, ob2.size() * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(lse2.data(), d_lse, lse2.size() * 4, cudaMemcpyDeviceToHost);
      std::string msg2;
      const bool ok2 = judge(ob2, lse2, &msg2);
      record(ok2, "summary given: " + msg2 + c.name());
      record(ob2 == ob && std::memcmp(lse2.data(), lse.data(), lse.size() * 4) == 0,
             "summary given: output bitwise equal to the scanning run's: " + c.name());
    }
    cudaFree(d_summary);
  }

  // The same forward on the mask bit-packed (DmaMaskFormat::kBits): packed
  // on the GPU into storage poisoned with ones (padding bits must come out
  // 0), the words equal to the CPU packing, the pair count the same, and the
  // output bitwise equal to the byte mask's (same kernels and order; only how
  // the mask is read differs) on the same core, scan and splits.
  if (!corrupt && p.mask.data != nullptr) {
    const size_t bits_bytes = dma_mask_bits_bytes(p);
    uint32_t* d_bits = nullptr;
    unsigned long long* d_pairs = nullptr;
    cudaMalloc(&d_bits, bits_bytes);
    cudaMalloc(&d_pairs, sizeof(unsigned long long));
    cudaMemset(d_bits, 0xFF, bits_bytes);
    cudaMemset(d_pairs, 0, sizeof(unsigned long long));
    cudaMemset(d_o, 0xFF, size_t(o_elems) * 2);
    cudaMemset(d_lse, 0xFF, size_t(rows) * 4);
    if (d_ws) cudaMemset(d_ws, 0xFF, a.workspace_bytes);
    const DynamicMaskProblem pb = dma_with_bit_mask(p, d_bits);
    DmaForwardArgs ab = a;
    ab.tile_counters = nullptr;
    cudaError_t e2 = dma_pack_mask_bits(p, d_bits, 0);
    if (e2 == cudaSuccess) e2 = dma_forward(pb, ab, 0);
    if (e2 == cudaSuccess) e2 = dma_count_visible_pairs(pb, d_pairs, 0);
    if (e2 == cudaSuccess) e2 = cudaDeviceSynchronize();
    if (e2 != cudaSuccess) {
      record(false, std::string("CUDA error ") + cudaGetErrorString(e2) + " (bit-packed mask): " + c.name());
      cudaGetLastError();
    } else {
      std::vector<uint32_t> bits(bits_bytes / 4);
      std::vector<uint16_t> ob2(ob.size());
      std::vector<float> lse2(lse.size());
      unsigned long long pairs_bits = 0;
      cudaMemcpy(bits.data(), d_bits, bits_bytes, cudaMemcpyDeviceToHost);
      cudaMemcpy(ob2.data(), d_o, ob2.size() * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(lse2.data(), d_lse, lse2.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(&pairs_bits, d_pairs, sizeof pairs_bits, cudaMemcpyDeviceToHost);
      record(bits == pack_mask_bits_cpu(in.mask, mp.mask_shape.elems() / c.Nk, c.Nk),
             "dma_pack_mask_bits == CPU packing: " + c.name());
      record(pairs_bits == counters[2], "pair count, bit-packed mask: " + c.name());
      record(ob2 == ob && std::memcmp(lse2.data(), lse.data(), lse.size() * 4) == 0,
             "bit-packed mask: output bitwise equal to the byte mask's: " + c.name());
    }
    cudaFree(d_bits);
    cudaFree(d_pairs);
  }

  if (!corrupt) {
    // Pair count: GPU == CPU.
    const int64_t pairs_cpu = masked_unmasked_pairs(mp, in.mask);
    record(int64_t(counters[2]) == pairs_cpu, "pair count " + std::to_string(counters[2]) + " vs CPU " +
                                                  std::to_string(pairs_cpu) + ": " + c.name());
    // A mask with all-zero tile columns must make the kernel skip tiles.
    if (c.mask && c.Nk > 128 && c.topk_window == 0 && c.band_from + 128 < c.Nk)
      record(counters[0] < counters[1], "tiles skipped (" + std::to_string(counters[0]) + " of " +
                                            std::to_string(counters[1]) + " run): " + c.name());
  }
  if (c.kv_misaligned) {
    d_k = kv_bases[0];
    d_v = kv_bases[1];
  }
  for (void* ptr : {d_q, d_k, d_v, d_o, static_cast<void*>(d_lse), static_cast<void*>(d_olp),
                    static_cast<void*>(d_lselp), static_cast<void*>(d_counters), static_cast<void*>(d_mask),
                    d_bias, static_cast<void*>(d_ws)})
    if (ptr) cudaFree(ptr);
}

}  // namespace

int main() {
  if (!have_gpu()) return kSkipped;
  uint64_t seed = 5005;
  std::vector<Case> cases;
  const std::pair<int, int> sizes[] = {{1, 1}, {17, 17}, {127, 127}, {129, 129}, {1000, 1000}, {17, 1000}, {1000, 17},
                                       {129, 300}};
  for (int D : {32, 64, 96, 128, 192, 256})
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true})
        for (auto [nq, nk] : sizes) {
          if (D != 64 && D != 128 && nq == 1000 && nk == 1000) continue;  // keep the CPU reference quick
          Case c{1, 4, 2, nq, nk, D, dt, causal, 0.f, true, true, 1, -1, nq, 1, -1, 1};
          cases.push_back(c);
        }
  // Broadcast forms of mask and bias, GQA/MQA, softcap, zero rows, no mask / no bias.
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (bool causal : {false, true}) {
      const int nq = 129, nk = 200;
      for (int mb : {1, 2})
        for (int mh : {0, -1, 1})
          for (int mq : {1, nq}) {
            Case c{2, 4, 2, nq, nk, 64, dt, causal, 0.f, true, true, mb, mh, mq, 3 - mb, mh, mq == 1 ? nq : 1};
            cases.push_back(c);
          }
      cases.push_back(Case{1, 4, 1, nq, nk, 128, dt, causal, 30.f, true, true, 1, 0, nq, 1, -1, 1});   // MQA + softcap
      cases.push_back(Case{1, 4, 4, nq, nk, 128, dt, causal, 0.f, false, true, 1, 0, 1, 1, 0, nq});    // bias only
      cases.push_back(Case{1, 4, 2, nq, nk, 96, dt, causal, 0.f, true, false, 1, 0, nq, 1, 0, 1});     // mask only
      cases.push_back(Case{1, 4, 2, nq, nk, 64, dt, causal, 0.f, false, false, 1, 0, 1, 1, 0, 1});     // neither
      Case z{1, 2, 2, nq, nk, 64, dt, causal, 5.f, true, true, 1, 0, nq, 1, 0, 1};
      z.zero_rows = true;
      cases.push_back(z);
      Case tk{1, 2, 1, 300, 700, 128, dt, causal, 0.f, true, true, 1, -1, 1, 1, -1, 1};
      // Mask from the bias: top-400 keys per query, block-smoothed by 64 —
      // ~45 of 55 tiles active (under the majority vote a W well under Nk/2
      // leaves no key block: the mask would be all zeros).
      tk.topk_window = 400;
      cases.push_back(tk);
    }
  // Masks whose rows are 16-byte aligned (Nk % 16 == 0), so that the mask
  // scans take their vector loads (every size above has Nk % 16 != 0, where
  // they read bytes): all ones (every "all" bit set; a ragged last tile of 16
  // keys), nearly all ones (tiles with a zero: "any" but not "all"), dense up
  // to a key then the sparse band, a random mask with the band from key 0,
  // split-KV (splits starting mid-word), GQA and batch-broadcast masks; on
  // the automatic scan, and below on the other one.
  for (int D : {64, 128})
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true}) {
        auto aligned = [&](Case c, double keep, int band_from, int splits = 1) {
          c.keep = keep;
          c.band_from = band_from;
          c.splits = splits;
          cases.push_back(c);
        };
        aligned(Case{1, 4, 2, 127, 1040, D, dt, causal, 0.f, true, true, 1, -1, 127, 1, -1, 1}, 1.0, 1040);
        aligned(Case{2, 4, 2, 200, 2048, D, dt, causal, 0.f, true, true, 1, -1, 200, 1, -1, 1}, 0.9995, 1024);
        aligned(Case{1, 2, 1, 300, 1536, D, dt, causal, 0.f, true, true, 1, 0, 300, 1, -1, 1}, 0.9, 600);
        aligned(Case{2, 2, 2, 129, 1024, D, dt, causal, 0.f, true, true, 2, -1, 129, 1, 0, 1}, 0.4, 0);
        aligned(Case{1, 4, 2, 17, 4096, D, dt, causal, 0.f, true, true, 1, -1, 17, 1, -1, 1}, 1.0, 2048, 3);
      }
  // Split-KV (decoding): every split count, including more splits than KV
  // tiles (empty splits), automatic, with and without a mask, causal, GQA.
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int splits : {0, 1, 2, 4, 8, 16, 64})
      for (auto [nq, nk] : {std::pair{1, 5000}, std::pair{17, 1000}, std::pair{129, 300}}) {
        Case c{1, 4, 2, nq, nk, 128, dt, true, 0.f, true, true, 1, -1, nq, 1, -1, 1};
        c.splits = splits;
        cases.push_back(c);
        Case d{2, 2, 1, nq, nk, 64, dt, false, 0.f, false, true, 1, -1, 1, 2, -1, 1};  // bias only
        d.splits = splits;
        cases.push_back(d);
      }
  // Decoding (one query row, the key-gather core): every head dim, sparse
  // (the band, top-W) and dense masks, rows longer than one 8192-key list
  // chunk without splits, many splits, GQA, softcap, a query-broadcast-free
  // bias, K and V not 16-byte aligned.
  for (int D : {32, 64, 96, 128, 192, 256})
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      Case c{1, 4, 2, 1, 3000, D, dt, true, 0.f, true, true, 1, -1, 1, 1, 0, 1};
      c.splits = 0;
      cases.push_back(c);  // band from key 0, automatic splits
      Case d{2, 2, 1, 1, 20000, D, dt, false, D == 128 ? 20.f : 0.f, true, true, 2, 0, 1, 2, -1, 1};
      d.keep = 0.03;
      cases.push_back(d);  // 3 chunks of keys in one split
      d.splits = 5;
      cases.push_back(d);
    }
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    Case c{1, 2, 1, 1, 4096, 128, dt, true, 0.f, true, true, 1, -1, 1, 1, -1, 1};
    c.keep = 1.0;
    c.band_from = 4096;  // all ones: every key gathered
    c.splits = 3;
    cases.push_back(c);
    Case t{1, 2, 1, 1, 9000, 128, dt, true, 0.f, true, true, 1, -1, 1, 1, -1, 1};
    t.topk_window = 5000;  // ~110 of 141 key blocks survive the vote (at W = 300: none)
    t.splits = 7;
    cases.push_back(t);
    Case m{1, 4, 2, 1, 777, 64, dt, false, 0.f, true, false, 1, 0, 1, 1, 0, 1};
    m.kv_misaligned = true;
    cases.push_back(m);
  }
  // Where the automatic core is wgmma (sm_90, D in {64, 128}), every such
  // case once more on the mma.sync core, so that both paths are checked;
  // decoding cases also on the core auto did not take (the gather core, or the
  // tile kernels below kDmaGatherMinKeys keys).
  const size_t n_auto = cases.size();
  // The core and scan rules only test whether a mask is given: any address will do.
  static uint8_t any_mask_byte;
  for (size_t i = 0; i < n_auto; ++i) {
    Case c = cases[i];
    DynamicMaskProblem shape;
    shape.D = c.D;
    const bool wgmma = dma_forward_core_name(shape, DmaCore::kAuto) == "wgmma";
    const bool gather = c.Nq == 1 && c.mask;
    if ((!wgmma && !gather) || c.kv_misaligned) continue;  // (the tile kernels refuse misaligned K, V)
    shape.Nq = c.Nq; shape.Nk = c.Nk;
    if (c.mask) shape.mask.data = &any_mask_byte;
    if (gather && dma_forward_core_name(shape, DmaCore::kAuto) != "gather") {
      c.core = DmaCore::kGather;
      cases.push_back(c);
    }
    c.core = DmaCore::kMma;
    cases.push_back(c);
    if (gather && wgmma) {
      c.core = DmaCore::kWgmma;
      cases.push_back(c);
    }
    if (wgmma && i % 3 == 0) {  // a third of them also with the wgmma core's cp.async copies
      c.core = DmaCore::kWgmmaCpAsync;
      cases.push_back(c);
    }
  }
  // Every case with a mask once more with the other mask scan than the
  // automatic choice (pre-pass or in-kernel), so that both are checked.
  const size_t n_cores = cases.size();
  for (size_t i = 0; i < n_auto; ++i) {
    Case c = cases[i];
    if (!c.mask) continue;
    DynamicMaskProblem shape;
    shape.B = c.B; shape.H = c.H; shape.Hkv = c.Hkv; shape.Nq = c.Nq; shape.Nk = c.Nk; shape.D = c.D;
    shape.mask.data = &any_mask_byte;
    shape.mask.set_shape(c.mb, heads_of(c.mh, c), c.mq, c.Nk, c.H);
    const bool auto_in_kernel =
        dma_forward_mask_scan_name(shape, DmaMaskScan::kAuto, dma_resolve_splits(shape, c.splits)) == "in-kernel";
    c.mask_scan = auto_in_kernel ? DmaMaskScan::kPrepass : DmaMaskScan::kInKernel;
    cases.push_back(c);
    // And pipelined (pre-pass chunks, forward per chunk on side streams)
    // where it runs as such: one split, a mask with rows per query.
    c.mask_scan = DmaMaskScan::kPipelined;
    if (dma_forward_mask_scan_name(shape, DmaMaskScan::kPipelined, dma_resolve_splits(shape, c.splits)) == "pipelined")
      cases.push_back(c);
  }
  std::printf("%zu cases (%zu more on the mma.sync core or wgmma with cp.async, %zu with the other mask scans)\n",
              cases.size(), n_cores - n_auto, cases.size() - n_cores);
  for (const Case& c : cases) run_case(c, ++seed);
  // The check can fail: the same rule on a corrupted output.
  run_case(Case{1, 2, 1, 129, 200, 64, DType::kFloat16, true, 0.f, true, true, 1, 0, 129, 1, 0, 1}, 77, true);
  // A bit-packed mask the kernels cannot read as laid out (base not 8-byte
  // aligned; an odd row stride) is refused with a reason, nothing launched.
  {
    DynamicMaskProblem p;
    p.Nq = p.Nk = 100;
    uint32_t* d_words = nullptr;
    cudaMalloc(&d_words, 4096);
    p.mask.data = d_words;
    p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
    DynamicMaskProblem off = dma_with_bit_mask(p, d_words + 1), odd = dma_with_bit_mask(p, d_words);
    odd.mask.stride_q += 1;
    const DmaForwardArgs none;
    for (const DynamicMaskProblem* bad : {&off, &odd})
      record(!dma_forward_unsupported(*bad).empty() && dma_forward(*bad, none, 0) == cudaErrorInvalidValue &&
                 !dma_backward_unsupported(*bad).empty(),
             "bit-packed mask refused: " + dma_forward_unsupported(*bad));
    cudaFree(d_words);
  }

  return finish();
}
