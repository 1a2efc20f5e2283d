// flash_attn_mma's dynamic-mask mode: --Hkv, --mask, --window,
// --block, --bias, --softcap. One shape; rows:
//   dmattn                  ours (kernels/dmattn/dmattn_fwd.cu)
//   split-q+stage2 (dense)  rung 02 on the same Q, K, V without mask or bias
//                           (only when Hkv == H): what skipping costs or saves
//   sdpa(...)+mask, torch(unfused)+mask   with --sdpa / --torch: torch given
//                           the same mask as one additive float mask
// TFLOPS are effective: 4·D·(unmasked pairs) / time for every row, the pairs
// counted on the GPU from the mask and the causal rule (the FLOP convention
// of the README, with pairs = the pairs this mask leaves), so a row's TFLOPS
// ratio is its speed ratio. The dense rung's row also shows its own TFLOPS
// (dense pairs) in the note.
#include "dmattn_mode.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <vector>

#include "dmattn/dmattn.h"
#include "host/variant.h"
#include "reference/reference.h"
#include "runner.h"
#include "torch_peers.h"

namespace attnlab {
namespace {

struct DmaRow {
  std::string name, kind = "rung", status, note;
  double ms = 0, tflops = 0;
  double err = -1, tol = -1, lse_err = -1;
};

// Device allocations freed on scope exit.
struct DeviceArena {
  std::vector<void*> ptrs;
  ~DeviceArena() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  std::string alloc(size_t count, T** out, const char* what) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16)) != cudaSuccess) {
      cudaGetLastError();
      char buf[128];
      std::snprintf(buf, sizeof buf, "out of GPU memory allocating %.2f GiB for %s", double(count * sizeof(T)) / (1 << 30),
                    what);
      return buf;
    }
    ptrs.push_back(p);
    *out = static_cast<T*>(p);
    return "";
  }
};



void append_csv(const std::string& path, const SystemInfo& sys, const DynamicMaskProblem& p, const Options& opt,
                uint64_t seed, const std::vector<DmaRow>& rows) {
  std::ofstream f = open_results_csv(path);
  double best_peer = 0;
  for (const DmaRow& r : rows)
    if (r.kind == "peer" && r.ms > 0) best_peer = std::max(best_peer, r.tflops);
  const std::string shape_note = "Hkv=" + std::to_string(p.Hkv) + "; mask=" + (opt.mask.empty() ? "none" : opt.mask) +
                                 (opt.mask == "topk" ? " W=" + std::to_string(opt.window) + " block=" +
                                                           std::to_string(opt.block)
                                                     : "") +
                                 (opt.bias ? "; bias (B;Hkv;1;Nk)" : "") +
                                 (p.softcap > 0 ? "; softcap " + std::to_string(p.softcap) : "");
  for (const DmaRow& r : rows) {
    char nums[96] = ",,";
    if (r.ms > 0) {
      if (r.kind == "rung" && best_peer > 0)
        std::snprintf(nums, sizeof nums, "%.6f,%.6g,%.3f", r.ms, r.tflops, r.tflops / best_peer);
      else std::snprintf(nums, sizeof nums, "%.6f,%.6g,", r.ms, r.tflops);
    }
    char errs[96] = ",,";
    if (r.err >= 0) std::snprintf(errs, sizeof errs, "%.3e,%.3e,%.3e", r.err, r.tol, r.lse_err);
    const std::string note = csv_field(shape_note + "; " + r.note);
    f << csv_field(sys.gpu) << ',' << csv_field(sys.driver) << ',' << csv_field(sys.cuda) << ',' << sys.commit << ','
      << sys.date << ',' << csv_field(r.name)
      << ',' << r.kind << ',' << p.B << ',' << p.H << ',' << p.Nq << ',' << p.Nk << ',' << p.D << ',' << p.D << ','
      << dtype_name(p.dtype) << ',' << (p.causal ? 1 : 0) << ',' << nums << ',' << r.status << ',' << errs << ','
      << seed << ',' << note << '\n';
  }
}

}  // namespace

int run_dynamic_mask_mode(const Options& opt, const SystemInfo& sys, uint64_t seed, cudaStream_t stream) {
  auto fail = [](const std::string& m, int code) {
    std::fprintf(stderr, "flash_attn_mma: error: %s\n", m.c_str());
    return code;
  };
  DynamicMaskProblem p;
  p.B = opt.B;
  p.H = opt.H;
  p.Hkv = opt.Hkv > 0 ? opt.Hkv : opt.H;
  p.Nq = opt.Nq;
  p.Nk = opt.Nk;
  p.D = opt.D;
  p.dtype = opt.dtype;
  p.causal = opt.causal;
  p.scale = default_scale(opt.D);
  p.softcap = opt.softcap;

  DeviceArena arena;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *bias = nullptr, *flush = nullptr;
  float *lse = nullptr, *o_ref = nullptr, *lse_ref = nullptr;
  uint8_t* mask = nullptr;
  unsigned long long* counters = nullptr;
  const int64_t q_elems = int64_t(p.B) * p.H * p.Nq * p.D, kv_elems = int64_t(p.B) * p.Hkv * p.Nk * p.D;
  const int64_t rows = int64_t(p.B) * p.H * p.Nq;
  const size_t flush_bytes = 256u << 20;
  std::string err;
  if (err.empty()) err = arena.alloc(size_t(q_elems) * 2, reinterpret_cast<uint8_t**>(&q), "Q");
  if (err.empty()) err = arena.alloc(size_t(kv_elems) * 2, reinterpret_cast<uint8_t**>(&k), "K");
  if (err.empty()) err = arena.alloc(size_t(kv_elems) * 2, reinterpret_cast<uint8_t**>(&v), "V");
  if (err.empty()) err = arena.alloc(size_t(q_elems) * 2, reinterpret_cast<uint8_t**>(&o), "O");
  if (err.empty()) err = arena.alloc(size_t(rows), &lse, "LSE");
  if (err.empty()) err = arena.alloc(size_t(3), &counters, "counters");
  if (err.empty()) err = arena.alloc(flush_bytes, reinterpret_cast<uint8_t**>(&flush), "the L2 flush");
  if (err.empty() && opt.bias) err = arena.alloc(size_t(p.B) * p.Hkv * p.Nk * 2, reinterpret_cast<uint8_t**>(&bias), "the bias");
  if (err.empty() && (opt.mask == "topk" || opt.mask == "ones"))
    err = arena.alloc(size_t(p.B) * p.Hkv * p.Nq * p.Nk, &mask, "the mask");
  if (!err.empty()) return fail(err, 1);

  cudaError_t e = fill_random_normal(q, q_elems, p.dtype, seed * 5 + 0, stream);
  if (e == cudaSuccess) e = fill_random_normal(k, kv_elems, p.dtype, seed * 5 + 1, stream);
  if (e == cudaSuccess) e = fill_random_normal(v, kv_elems, p.dtype, seed * 5 + 2, stream);
  if (e == cudaSuccess && bias) {
    e = fill_random_normal(bias, int64_t(p.B) * p.Hkv * p.Nk, p.dtype, seed * 5 + 3, stream);
    p.bias.data = bias;
    p.bias.set_shape(p.B, p.Hkv, 1, p.Nk, p.H);  // flash-dmattn's (B, Hkv, 1, Nk)
  }
  if (e == cudaSuccess && mask) {
    if (opt.mask == "ones") {
      e = cudaMemsetAsync(mask, 1, size_t(p.B) * p.Hkv * p.Nq * p.Nk, stream);
    } else {
      e = dma_build_topk_mask(p, opt.window, opt.block, mask, stream);
      if (e == cudaErrorInvalidValue)
        return fail("the top-W mask builder cannot take Nk=" + std::to_string(p.Nk) + " on this GPU", 2);
    }
    p.mask.data = mask;
    p.mask.set_shape(p.B, p.Hkv, p.Nq, p.Nk, p.H);
  }
  if (e == cudaSuccess) e = cudaMemsetAsync(counters, 0, 3 * sizeof(unsigned long long), stream);
  if (e == cudaSuccess) e = dma_count_visible_pairs(p, counters + 2, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return fail(cuda_error_text("preparing inputs", e), 1);
  unsigned long long pairs = 0;
  cudaMemcpy(&pairs, counters + 2, sizeof pairs, cudaMemcpyDeviceToHost);
  const double flops = 2.0 * (p.D + p.D) * double(pairs);  // 2·(D+Dv)·pairs; pairs summed over B·H

  std::printf("%s\n", std::string(150, '-').c_str());
  std::printf("dynamic-mask attention: %s; mask %s%s; unmasked pairs %llu (%.2f%% of Nq·Nk·B·H); seed %llu\n",
              p.shape_string().c_str(), opt.mask.empty() ? "none" : opt.mask.c_str(),
              opt.mask == "topk" ? (" W=" + std::to_string(opt.window) + " block=" + std::to_string(opt.block)).c_str()
                                 : "",
              pairs, 100.0 * double(pairs) / (double(p.B) * p.H * p.Nq * p.Nk), (unsigned long long)seed);

  std::vector<DmaRow> out_rows;
  int failures = 0;

  // ---- ours ------------------------------------------------------------------------
  DmaRow ours;
  ours.name = "dmattn";
  DmaForwardArgs a;  // kept: the backward re-runs the forward for its O and LSE
  if (std::string why = dma_forward_unsupported(p); !why.empty()) {
    ours.status = "unsupported";
    ours.note = why;
  } else {
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = o;
    a.lse = lse;
    a.tile_counters = counters;
    a.splits = dma_resolve_splits(p, opt.splits);
    a.core = opt.dma_core == "mma"              ? DmaCore::kMma
             : opt.dma_core == "wgmma"          ? DmaCore::kWgmma
             : opt.dma_core == "wgmma-cp.async" ? DmaCore::kWgmmaCpAsync
             : opt.dma_core == "gather"         ? DmaCore::kGather
                                                : DmaCore::kAuto;
    a.mask_scan = opt.dma_mask_scan == "prepass"     ? DmaMaskScan::kPrepass
                  : opt.dma_mask_scan == "in-kernel" ? DmaMaskScan::kInKernel
                  : opt.dma_mask_scan == "pipelined" ? DmaMaskScan::kPipelined
                                                     : DmaMaskScan::kAuto;
    a.prepass_chunks = opt.dma_prepass_chunks;
    const std::string core = dma_forward_core_name(p, a.core);
    if (core.empty())
      return fail(a.core == DmaCore::kGather
                      ? "dmattn: --dma-core gather needs one query row (--Nq 1) and a mask"
                      : "dmattn: --dma-core wgmma needs an sm_90 GPU, a build with sm_90a code and D in {64, 128}",
                  2);
    if (dma_forward_workspace_bytes(p, a.splits) > 0) {  // the mask summary and/or the split partials
      a.workspace_bytes = dma_forward_workspace_bytes(p, a.splits);
      if (std::string e2 = arena.alloc(a.workspace_bytes / sizeof(float), &a.workspace, "the forward workspace");
          !e2.empty())
        return fail(e2, 1);
    }
    cudaMemsetAsync(o, 0xFF, size_t(q_elems) * 2, stream);
    cudaMemsetAsync(lse, 0xFF, size_t(rows) * 4, stream);
    e = dma_forward(p, a, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return fail(cuda_error_text("dmattn", e), 1);
    unsigned long long tiles[2] = {0, 0};
    cudaMemcpy(tiles, counters, sizeof tiles, cudaMemcpyDeviceToHost);
    a.tile_counters = nullptr;  // counted once; the timed launches do not pay for the atomics
    const double grid_tiles = double(p.B) * p.H * ((p.Nq + kDmaBr - 1) / kDmaBr) * ((p.Nk + kDmaBc - 1) / kDmaBc);
    std::string scan = dma_forward_mask_scan_name(p, a.mask_scan, a.splits, a.core);
    if (scan == "pipelined") scan += " (" + std::to_string(dma_resolve_prepass_chunks(p, a.prepass_chunks)) + " chunks)";
    char note[260];
    std::snprintf(note, sizeof note,
                  "tiles skipped %.1f%% (%llu of %.0f 64x64 tiles run; causal range %llu); splits %d; core %s; mask scan %s",
                  100.0 * (1.0 - double(tiles[0]) / grid_tiles), tiles[0], grid_tiles, tiles[1], a.splits, core.c_str(),
                  scan.c_str());
    ours.note = note;
    ours.status = "unchecked";
    if (opt.check) {
      if (p.Nk > dma_reference_max_nk()) {
        ours.note += "; not checked: the reference takes Nk <= " + std::to_string(dma_reference_max_nk());
      } else {
        if (err.empty()) err = arena.alloc(size_t(q_elems), &o_ref, "the reference");
        if (err.empty()) err = arena.alloc(size_t(rows), &lse_ref, "the reference LSE");
        if (!err.empty()) return fail(err, 1);
        float* o_lp = nullptr;
        float* lse_lp = nullptr;
        if (std::string e2 = arena.alloc(size_t(q_elems), &o_lp, "the low-precision reference"); !e2.empty())
          return fail(e2, 1);
        if (std::string e2 = arena.alloc(size_t(rows), &lse_lp, "the low-precision LSE"); !e2.empty()) return fail(e2, 1);
        e = dma_reference_fp32(p, q, k, v, o_ref, lse_ref, false, stream);
        if (e == cudaSuccess) e = dma_reference_fp32(p, q, k, v, o_lp, lse_lp, true, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return fail(cuda_error_text("dmattn reference", e), 1);
        // Baseline: the error of the same-precision unfused path (S and P
        // rounded to the input dtype) against the fp32 reference.
        const ErrorStats base = compare_output_fp32(o_lp, o_ref, q_elems, stream);
        const ErrorStats mine = compare_output(o, p.dtype, o_ref, q_elems, stream);
        const ErrorStats lse_stats = compare_lse(lse, lse_ref, rows, stream);
        const double rounding = output_rounding_error(o_ref, q_elems, p.dtype, stream);
        const CheckResult c = judge(mine, lse_stats, base.max_abs_err, rounding);
        ours.err = c.err;
        ours.tol = c.tol;
        ours.lse_err = c.lse_err;
        ours.status = c.pass ? "PASS" : "FAIL";
        ours.note = c.summary() + "; " + ours.note;
        if (!c.pass) ++failures;
      }
    }
    Timing timing;
    if (std::string t = time_calls(
            [&] {
              const cudaError_t r = dma_forward(p, a, stream);
              return r == cudaSuccess ? std::string() : cuda_error_text("dmattn", r);
            },
            opt.warmup, opt.iters, flush, flush_bytes, stream, &timing);
        !t.empty())
      return fail(t, 1);
    ours.ms = timing.median_ms;
    ours.tflops = flops / (ours.ms * 1e-3) / 1e12;
  }
  out_rows.push_back(ours);
  // The dmattn row's output (its timed calls wrote it last): the rows below
  // on the same problem must match it bit for bit.
  std::vector<uint16_t> o_ours;
  if (ours.ms > 0) {
    o_ours.resize(static_cast<size_t>(q_elems));
    cudaMemcpy(o_ours.data(), o, o_ours.size() * 2, cudaMemcpyDeviceToHost);
  }

  // A row of ours run another way on the same problem (the summary given, the
  // mask as bits): one run into poisoned output, compared bit for bit with
  // the dmattn row's, then timed; fills the row's ms, TFLOPS and status, and
  // returns an error's text (labelled with the row's name) or "".
  auto bitwise_row = [&](DmaRow& row, const DynamicMaskProblem& rp, const DmaForwardArgs& ra) -> std::string {
    std::vector<uint16_t> out(static_cast<size_t>(q_elems));
    cudaError_t r = cudaMemsetAsync(o, 0xFF, size_t(q_elems) * 2, stream);
    if (r == cudaSuccess) r = dma_forward(rp, ra, stream);
    if (r == cudaSuccess) r = cudaStreamSynchronize(stream);
    if (r == cudaSuccess) r = cudaMemcpy(out.data(), o, out.size() * 2, cudaMemcpyDeviceToHost);
    if (r != cudaSuccess) return cuda_error_text(row.name.c_str(), r);
    const bool same = out == o_ours;
    if (!same) ++failures;
    Timing timing;
    if (std::string t = time_calls(
            [&] {
              const cudaError_t e2 = dma_forward(rp, ra, stream);
              return e2 == cudaSuccess ? std::string() : cuda_error_text(row.name.c_str(), e2);
            },
            opt.warmup, opt.iters, flush, flush_bytes, stream, &timing);
        !t.empty())
      return t;
    row.ms = timing.median_ms;
    row.tflops = flops / (row.ms * 1e-3) / 1e12;
    row.status = same ? "PASS" : "FAIL";
    return {};
  };

  // ---- ours again, the mask's summary given --------------------------------------------
  // For a mask used more than once (forward after forward; layers or calls
  // sharing it): dma_build_mask_summary once, outside the timed calls (its own
  // time is in the note), then forwards that scan nothing
  // (DmaForwardArgs::mask_summary). Checked bitwise against the row above.
  double given_ms = 0;
  if (ours.ms > 0 && p.mask.data != nullptr && dma_forward_core_name(p, a.core) != "gather") {
    DmaRow given_row;
    given_row.name = "dmattn (mask summary given)";
    uint32_t* summary = nullptr;
    if (std::string e2 = arena.alloc((dma_mask_summary_bytes(p) + 15) / 16 * 4, &summary, "the mask summary");
        !e2.empty())
      return fail(e2, 1);
    Timing build_timing;
    if (std::string t = time_calls(
            [&] {
              const cudaError_t r = dma_build_mask_summary(p, summary, stream);
              return r == cudaSuccess ? std::string() : cuda_error_text("dma_build_mask_summary", r);
            },
            opt.warmup, opt.iters, flush, flush_bytes, stream, &build_timing);
        !t.empty())
      return fail(t, 1);
    DmaForwardArgs given = a;
    given.mask_summary = summary;
    if (std::string t = bitwise_row(given_row, p, given); !t.empty()) return fail(t, 1);
    given_ms = given_row.ms;
    char note[240];
    std::snprintf(note, sizeof note,
                  "%s the dmattn row's output; no mask scan: the summary built once beforehand by "
                  "dma_build_mask_summary (%.4f ms, not in this time)",
                  given_row.status == "PASS" ? "bitwise equal to" : "DIFFERS from", build_timing.median_ms);
    given_row.note = note;
    out_rows.push_back(given_row);
  }

  // ---- ours again, the mask bit-packed ---------------------------------------------------
  // --mask-bits: the same mask as one bit per (query, key) (DmaMaskFormat::
  // kBits), packed once by dma_pack_mask_bits outside the timed calls (its
  // own time is in the note) — a mask builder could write it so directly.
  // The scan reads an eighth of the bytes. Checked bitwise against the
  // dmattn row's output.
  DynamicMaskProblem pb;  // p with the packed mask (for the backward's row too)
  DmaForwardArgs ab;
  double bits_ms = 0;
  if (opt.mask_bits && ours.ms > 0 && p.mask.data != nullptr) {
    DmaRow bits_row;
    bits_row.name = "dmattn (bit-packed mask)";
    uint32_t* bits = nullptr;
    if (std::string e2 = arena.alloc(dma_mask_bits_bytes(p) / 4 + 2, &bits, "the bit-packed mask"); !e2.empty())
      return fail(e2, 1);
    Timing pack_timing;
    if (std::string t = time_calls(
            [&] {
              const cudaError_t r = dma_pack_mask_bits(p, bits, stream);
              return r == cudaSuccess ? std::string() : cuda_error_text("dma_pack_mask_bits", r);
            },
            opt.warmup, opt.iters, flush, flush_bytes, stream, &pack_timing);
        !t.empty())
      return fail(t, 1);
    pb = dma_with_bit_mask(p, bits);
    ab = a;
    if (std::string t = bitwise_row(bits_row, pb, ab); !t.empty()) return fail(t, 1);
    bits_ms = bits_row.ms;
    char note[300];
    std::snprintf(note, sizeof note,
                  "%s the dmattn row's output; the mask as bits (%.1f MiB instead of %.1f), packed once beforehand by "
                  "dma_pack_mask_bits (%.4f ms, not in this time); mask scan %s",
                  bits_row.status == "PASS" ? "bitwise equal to" : "DIFFERS from",
                  double(dma_mask_bits_bytes(p)) / (1 << 20),
                  double(p.mask.elems(p.Nk)) / (1 << 20), pack_timing.median_ms,
                  dma_forward_mask_scan_name(pb, ab.mask_scan, ab.splits, ab.core).c_str());
    bits_row.note = note;
    out_rows.push_back(bits_row);
  }

  // ---- the dense rung on the same Q, K, V ----------------------------------------------
  if (p.Hkv == p.H) {
    DmaRow dense;
    dense.name = "split-q+stage2 (dense)";
    const Variant* rung = nullptr;
    for (const Variant& var : all_variants())
      if (var.name == "split-q+stage2") rung = &var;
    AttnProblem dp = p.dense();
    if (rung == nullptr || !rung->unsupported_reason(dp).empty()) {
      dense.status = "unsupported";
      dense.note = rung ? rung->unsupported_reason(dp) : "split-q+stage2 is not registered";
    } else {
      AttnBuffers b;
      b.q = q;
      b.k = k;
      b.v = v;
      b.o = o;
      b.lse = lse;
      Timing timing;
      if (std::string t = time_calls(
              [&] {
                const cudaError_t r = rung->launch(dp, b, stream);
                return r == cudaSuccess ? std::string() : cuda_error_text("split-q+stage2", r);
              },
              opt.warmup, opt.iters, flush, flush_bytes, stream, &timing);
          !t.empty())
        return fail(t, 1);
      dense.ms = timing.median_ms;
      dense.tflops = flops / (dense.ms * 1e-3) / 1e12;
      dense.status = "unchecked";
      char note[160];
      std::snprintf(note, sizeof note, "no mask or bias; its own dense TFLOPS %.1f; dmattn / dense speed %.2fx",
                    forward_flops(dp) / (dense.ms * 1e-3) / 1e12, ours.ms > 0 ? dense.ms / ours.ms : 0.0);
      dense.note = note;
    }
    out_rows.push_back(dense);
  }

  // ---- torch with the same mask -------------------------------------------------------------
  // One row per peer: its first call builds its graph (untimed), then the timed
  // calls; a peer that cannot run, or a setup that failed, is an unsupported row.
  auto add_peer_rows = [&](const std::vector<MaskedTorchPeer>& peers, const std::string& setup,
                           const std::string& setup_row, double row_flops, double ours_ms, const char* ours_name,
                           double row_given_ms = 0, double row_bits_ms = 0) {
    if (!setup.empty()) {
      DmaRow r;
      r.name = setup_row;
      r.kind = "peer";
      r.status = "unsupported";
      r.note = setup;
      out_rows.push_back(r);
    }
    for (const MaskedTorchPeer& peer : peers) {
      DmaRow r;
      r.name = peer.name;
      r.kind = "peer";
      Timing timing;
      std::string t = peer.run(stream);
      if (t.empty()) t = time_calls([&] { return peer.run(stream); }, opt.warmup, opt.iters, flush, flush_bytes, stream, &timing);
      if (!t.empty()) {
        r.status = "unsupported";
        r.note = t;
        cudaGetLastError();
      } else {
        r.ms = timing.median_ms;
        r.tflops = row_flops / (r.ms * 1e-3) / 1e12;
        r.status = "unchecked";
        char note[96];
        std::snprintf(note, sizeof note, "%s is %.2fx faster", ours_name, ours_ms > 0 ? r.ms / ours_ms : 0.0);
        r.note = note;
        if (row_given_ms > 0) {
          std::snprintf(note, sizeof note, " (%.2fx with the mask summary given)", r.ms / row_given_ms);
          r.note += note;
        }
        if (row_bits_ms > 0) {
          std::snprintf(note, sizeof note, " (%.2fx with the bit-packed mask)", r.ms / row_bits_ms);
          r.note += note;
        }
        if (!peer.about.empty()) r.note += "; " + peer.about;
      }
      out_rows.push_back(r);
    }
  };
  if (opt.sdpa || opt.torch) {
    std::string setup;
    const std::vector<MaskedTorchPeer> peers = make_masked_torch_peers(p, q, k, v, &setup);
    add_peer_rows(peers, setup, "torch+mask", flops, ours.ms, "dmattn", given_ms, bits_ms);
  }

  // ---- backward ---------------------------------------------------------------------
  if (opt.bwd && ours.ms > 0) {
    // The forward's O and LSE: the dense rung and the torch rows above wrote
    // over o and lse, so run the dynamic-mask forward once more.
    if (cudaError_t r = dma_forward(p, a, stream); r != cudaSuccess) return fail(cuda_error_text("dmattn", r), 1);
    DmaRow bwd;
    bwd.name = "dmattn bwd";
    const double bwd_flops = 2.0 * (3 * p.D + 2 * p.D) * double(pairs);
    if (std::string why = dma_backward_unsupported(p); !why.empty()) {
      bwd.status = "unsupported";
      bwd.note = why;
      out_rows.push_back(bwd);
    } else {
      const int64_t bias_elems = p.bias.data ? p.bias.elems(p.Nk) : 0;
      void *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dbias = nullptr;
      float* ws = nullptr;
      const int bwd_chunks = dma_backward_resolve_chunks(p, opt.deterministic, opt.bwd_chunks);
      const size_t ws_bytes = dma_backward_workspace_bytes(p, opt.deterministic, bwd_chunks);
      std::string e2;
      if (e2.empty()) e2 = arena.alloc(size_t(q_elems) * 2, reinterpret_cast<uint8_t**>(&dout), "dO");
      if (e2.empty()) e2 = arena.alloc(size_t(q_elems) * 2, reinterpret_cast<uint8_t**>(&dq), "dQ");
      if (e2.empty()) e2 = arena.alloc(size_t(kv_elems) * 2, reinterpret_cast<uint8_t**>(&dk), "dK");
      if (e2.empty()) e2 = arena.alloc(size_t(kv_elems) * 2, reinterpret_cast<uint8_t**>(&dv), "dV");
      if (e2.empty() && bias_elems) e2 = arena.alloc(size_t(bias_elems) * 2, reinterpret_cast<uint8_t**>(&dbias), "dBias");
      if (e2.empty()) e2 = arena.alloc(ws_bytes / sizeof(float) + 1, &ws, "the backward workspace");
      if (!e2.empty()) return fail(e2, 1);
      if (cudaError_t r = fill_random_normal(dout, q_elems, p.dtype, seed * 5 + 4, stream); r != cudaSuccess)
        return fail(cuda_error_text("dO", r), 1);
      DmaBackwardArgs ba;
      ba.q = q;
      ba.k = k;
      ba.v = v;
      ba.o = o;
      ba.lse = lse;
      ba.dout = dout;
      ba.dq = dq;
      ba.dk = dk;
      ba.dv = dv;
      ba.dbias = dbias;
      ba.workspace = ws;
      ba.workspace_bytes = ws_bytes;
      ba.deterministic = opt.deterministic;
      ba.rotate_slots = opt.bwd_rotate;
      ba.q_chunks = opt.bwd_chunks;  // as asked (0: automatic, which may plan the chunks on the device)
      ba.core = opt.dma_core == "mma" ? DmaCore::kMma : opt.dma_core == "auto" ? DmaCore::kAuto : DmaCore::kWgmma;
      // As in training: where the forward stored the mask's tile bits (its
      // pre-pass, or its in-kernel scan with one split), the backward reads
      // them instead of running its own pre-pass (the forward's workspace is
      // not touched between the forward above and these calls).
      // --bwd-own-prepass: the backward alone, its own pre-pass timed with it.
      ba.mask_summary = opt.bwd_own_prepass ? nullptr : dma_forward_mask_summary(p, a);
      if (opt.deterministic) bwd.name += " (deterministic)";
      e = dma_backward(p, ba, stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess) return fail(cuda_error_text("dmattn backward", e), 1);
      bwd.status = "unchecked";
      // The references (with --check), kept for the bit-packed mask's row.
      float *rq = nullptr, *rk = nullptr, *rv = nullptr, *rb = nullptr;
      float *lq = nullptr, *lk = nullptr, *lv = nullptr, *lb = nullptr;
      // The rule, per gradient: max |g - g_ref| <= 2 x the error of the
      // same-precision reference (S, P, dP, dS rounded to the dtype) + 1e-3 x
      // max |g_ref| + 1e-4. Adds "dQ err/tol" to *summary, false on a failure.
      auto judge_grad = [&](const char* what, const void* g, const float* ref, const float* lp, int64_t n,
                            std::string* summary) {
        std::vector<float> host(static_cast<size_t>(n));
        cudaMemcpy(host.data(), ref, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost);
        double scale = 0;
        for (float x : host) scale = std::max(scale, double(std::fabs(x)));
        const ErrorStats s = compare_output(g, p.dtype, ref, n, stream);
        const ErrorStats base = compare_output_fp32(lp, ref, n, stream);
        const double tol = 2 * base.max_abs_err + 1e-3 * scale + 1e-4;
        const bool ok = s.nonfinite == 0 && s.max_abs_err <= tol;
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s%s %.1e/%.1e", summary->empty() ? "" : ", ", what, s.max_abs_err, tol);
        *summary += buf;
        return ok;
      };
      auto judge_grads = [&](std::string* summary) {
        bool pass = judge_grad("dQ", dq, rq, lq, q_elems, summary);
        pass = judge_grad("dK", dk, rk, lk, kv_elems, summary) && pass;
        pass = judge_grad("dV", dv, rv, lv, kv_elems, summary) && pass;
        if (bias_elems) pass = judge_grad("dBias", dbias, rb, lb, bias_elems, summary) && pass;
        return pass;
      };
      if (opt.check && p.Nk <= dma_reference_backward_max_nk()) {
        const size_t nb = size_t(std::max<int64_t>(1, bias_elems));
        if (e2.empty()) e2 = arena.alloc(size_t(q_elems), &rq, "the reference dQ");
        if (e2.empty()) e2 = arena.alloc(size_t(kv_elems), &rk, "the reference dK");
        if (e2.empty()) e2 = arena.alloc(size_t(kv_elems), &rv, "the reference dV");
        if (e2.empty()) e2 = arena.alloc(nb, &rb, "the reference dBias");
        if (e2.empty()) e2 = arena.alloc(size_t(q_elems), &lq, "the same-precision dQ");
        if (e2.empty()) e2 = arena.alloc(size_t(kv_elems), &lk, "the same-precision dK");
        if (e2.empty()) e2 = arena.alloc(size_t(kv_elems), &lv, "the same-precision dV");
        if (e2.empty()) e2 = arena.alloc(nb, &lb, "the same-precision dBias");
        if (!e2.empty()) return fail(e2, 1);
        e = dma_reference_backward_fp32(p, q, k, v, dout, rq, rk, rv, bias_elems ? rb : nullptr, stream);
        if (e == cudaSuccess)
          e = dma_reference_backward_fp32(p, q, k, v, dout, lq, lk, lv, bias_elems ? lb : nullptr, stream,
                                          /*low_precision=*/true);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return fail(cuda_error_text("dmattn reference backward", e), 1);
        std::string summary;
        const bool pass = judge_grads(&summary);
        bwd.status = pass ? "PASS" : "FAIL";
        bwd.note = summary + " (err/tol: 2 x same-precision err + floor); ";
        if (!pass) ++failures;
      }
      // Deterministic mode: the gradients after the timed runs must equal the
      // first run's bit for bit (every run rewrites them from scratch).
      auto grad_bytes = [&] {
        std::vector<uint8_t> h(size_t(2 * q_elems + 4 * kv_elems + 2 * bias_elems));
        cudaMemcpy(h.data(), dq, size_t(q_elems) * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(h.data() + 2 * q_elems, dk, size_t(kv_elems) * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(h.data() + 2 * q_elems + 2 * kv_elems, dv, size_t(kv_elems) * 2, cudaMemcpyDeviceToHost);
        if (bias_elems)
          cudaMemcpy(h.data() + 2 * q_elems + 4 * kv_elems, dbias, size_t(bias_elems) * 2, cudaMemcpyDeviceToHost);
        return h;
      };
      const std::vector<uint8_t> first = opt.deterministic && opt.check ? grad_bytes() : std::vector<uint8_t>{};
      Timing timing;
      if (std::string t = time_calls(
              [&] {
                const cudaError_t r = dma_backward(p, ba, stream);
                return r == cudaSuccess ? std::string() : cuda_error_text("dmattn backward", r);
              },
              opt.warmup, opt.iters, flush, flush_bytes, stream, &timing);
          !t.empty())
        return fail(t, 1);
      if (!first.empty()) {
        const bool same = grad_bytes() == first;
        bwd.note += same ? "bitwise identical over " + std::to_string(1 + opt.warmup + opt.iters) + " runs; "
                         : "NOT bitwise identical across runs; ";
        if (!same) {
          bwd.status = "FAIL";
          ++failures;
        }
      }
      bwd.ms = timing.median_ms;
      bwd.tflops = bwd_flops / (bwd.ms * 1e-3) / 1e12;
      const int walked = dma_backward_walked_chunks(p, opt.deterministic, opt.bwd_chunks, ws);
      bwd.note += "q chunks " + std::to_string(walked) +
                  (!dma_backward_plans_chunks(p, opt.deterministic, opt.bwd_chunks) ? ""
                   : walked == bwd_chunks ? " (the chunk plan kept them: skewed)"
                                          : " (of " + std::to_string(bwd_chunks) + " launched: the chunk plan found the slots even)") +
                  (ba.rotate_slots ? "" : "; query tiles in order") + "; core " + dma_backward_core_name(p, ba.core) +
                  (p.mask.data == nullptr       ? ""
                   : ba.mask_summary != nullptr
                       ? (a.mask_summary != nullptr ? std::string("; mask summary: the one given to the forward")
                                                    : "; mask summary: the forward's " +
                                                          dma_forward_mask_scan_name(p, a.mask_scan, a.splits, a.core)) +
                             " (the mask not read again)"
                       : "; mask summary: its own pre-pass (the mask read again, in this time)") +
                  "; TFLOPS count 2·(3D+2Dv)·unmasked pairs";
      out_rows.push_back(bwd);

      // --mask-bits: the same backward on the bit-packed mask, after a forward
      // on it (whose summary it reads, as the byte row does); checked against
      // the same references, and in deterministic mode bitwise against the
      // byte row's gradients.
      double bwd_bits_ms = 0;
      if (opt.mask_bits && bits_ms > 0) {
        DmaRow brow;
        brow.name = bwd.name + " (bit-packed mask)";
        DmaBackwardArgs bb = ba;
        bb.mask_summary = opt.bwd_own_prepass ? nullptr : dma_forward_mask_summary(pb, ab);
        const std::vector<uint8_t> bytes_grads = opt.deterministic ? grad_bytes() : std::vector<uint8_t>{};
        e = dma_forward(pb, ab, stream);
        if (e == cudaSuccess) e = cudaMemsetAsync(dq, 0xFF, size_t(q_elems) * 2, stream);
        if (e == cudaSuccess) e = cudaMemsetAsync(dk, 0xFF, size_t(kv_elems) * 2, stream);
        if (e == cudaSuccess) e = cudaMemsetAsync(dv, 0xFF, size_t(kv_elems) * 2, stream);
        if (e == cudaSuccess) e = dma_backward(pb, bb, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return fail(cuda_error_text("dmattn backward (bit-packed mask)", e), 1);
        brow.status = "unchecked";
        if (rq != nullptr) {
          std::string summary;
          const bool pass = judge_grads(&summary);
          brow.status = pass ? "PASS" : "FAIL";
          brow.note = summary + " (err/tol: 2 x same-precision err + floor); ";
          if (!pass) ++failures;
        }
        if (!bytes_grads.empty()) {
          const bool same = grad_bytes() == bytes_grads;
          brow.note += same ? "bitwise identical to the byte mask's gradients; " : "DIFFERS from the byte mask's gradients; ";
          if (!same) {
            brow.status = "FAIL";
            ++failures;
          }
        }
        Timing bits_timing;
        if (std::string t = time_calls(
                [&] {
                  const cudaError_t r = dma_backward(pb, bb, stream);
                  return r == cudaSuccess ? std::string() : cuda_error_text("dmattn backward (bit-packed mask)", r);
                },
                opt.warmup, opt.iters, flush, flush_bytes, stream, &bits_timing);
            !t.empty())
          return fail(t, 1);
        bwd_bits_ms = bits_timing.median_ms;
        brow.ms = bwd_bits_ms;
        brow.tflops = bwd_flops / (brow.ms * 1e-3) / 1e12;
        brow.note += bb.mask_summary != nullptr
                         ? "mask summary: the bit-packed forward's " + dma_forward_mask_scan_name(pb, ab.mask_scan, ab.splits, ab.core)
                         : std::string("mask summary: its own pre-pass of the bits, in this time");
        out_rows.push_back(brow);
      }

      if (opt.sdpa || opt.torch) {
        std::string setup;
        // Every pair active (no mask, --mask causal or ones): with
        // --sdpa also FA2's backward without the mask and bias, the dense
        // reference (the same pair count).
        const bool all_active = (opt.mask.empty() || opt.mask == "none" || opt.mask == "causal" || opt.mask == "ones");
        const std::vector<MaskedTorchPeer> peers =
            make_masked_torch_peers(p, q, k, v, &setup, dout, opt.sdpa && all_active);
        add_peer_rows(peers, setup, "torch+mask bwd", bwd_flops, bwd.ms, "dmattn bwd", 0, bwd_bits_ms);
      }
    }
  }

  for (const DmaRow& r : out_rows) {
    if (r.ms > 0)
      std::printf("%32s: time:%.6fms, effective TFLOPS:%-8.2f %-10s %s\n", r.name.c_str(), r.ms, r.tflops,
                  r.status.c_str(), r.note.c_str());
    else
      std::printf("%32s: %s: %s\n", r.name.c_str(), r.status.c_str(), r.note.c_str());
  }
  std::printf("%s | driver %s | CUDA %s | torch %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(),
              sys.cuda.c_str(), torch_version().c_str(), sys.commit.c_str(), sys.date.c_str());
  if (!opt.csv.empty()) append_csv(opt.csv, sys, p, opt, seed, out_rows);
  if (failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", failures, failures > 1 ? "s" : "");
    return 1;
  }
  return 0;
}

}  // namespace attnlab
