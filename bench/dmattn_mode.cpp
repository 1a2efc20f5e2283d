// flash_attn_mma's dynamic-mask mode: one shape, the options of the
// dynamic-mask section of --help. Rows:
//   dmattn                       ours (kernels/dmattn/dmattn_fwd.cu)
//   dmattn (mask summary given)  ours, the mask's tile summary built beforehand
//   dmattn (bit-packed mask)     ours on the same mask as bits (--mask-bits)
//   split-q+stage2 (dense)       rung 02 on the same Q, K, V (GQA too) without mask
//                                or bias: what skipping costs or saves
//   sdpa(...)+mask, torch(unfused)+mask   in a torch build (unless --no-peers):
//                                torch given the same mask as one additive float mask,
//                                and sdpa(cudnn) without it: the dense speed of light;
//                                with no mask and no bias, plain unmasked torch rows
//   dmattn bwd ..., ... bwd      with --bwd: the same rows for the backward
// TFLOPS are effective: 4·D·(unmasked pairs) / time for every row, the pairs
// counted on the GPU from the mask and the causal rule (the FLOP convention
// of the README, with pairs = the pairs this mask leaves), so a row's TFLOPS
// ratio is its speed ratio. The dense rung's row also shows its own TFLOPS
// (dense pairs) in the note.
//
// run_dynamic_mask_mode, at the bottom, reads as the run does: set_up (the
// problem, buffers, inputs, masks), the forward rows of ours, the peers, the
// backward rows, then the report.
#include "dmattn_mode.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <vector>

#include "dmattn/dmattn.h"
#include "host/variant.h"
#include "reference/reference.h"
#include "runner.h"
#include "table.h"
#include "torch_peers.h"

namespace attnlab {
namespace {

struct DmaRow {
  std::string name, kind = "rung", status, note;
  double ms = 0, tflops = 0;
  double err = -1, tol = -1, lse_err = -1;
};

// What every row of one run shares: the problem, its device buffers, the
// dmattn row's forward (the rows after it reuse its arguments and compare
// against its output) and the rows so far.
struct DmaRun {
  DmaRun(const CommonOptions& options, const DynamicMaskOptions& dynamic_mask, uint64_t input_seed, cudaStream_t s)
      : opt(options), dm(dynamic_mask), seed(input_seed), stream(s) {}
  const CommonOptions& opt;
  const DynamicMaskOptions& dm;
  const uint64_t seed;
  const cudaStream_t stream;
  DynamicMaskProblem p;

  DeviceArena arena;
  // Q, K, V, O in the input dtype; LSE in fp32; the bias and the byte mask
  // where asked for; three counters (tiles run, causal range, visible pairs);
  // the buffer written before every timed call to evict L2.
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *bias = nullptr, *flush = nullptr;
  float* lse = nullptr;
  uint8_t* mask = nullptr;
  unsigned long long* counters = nullptr;
  int64_t q_elems = 0, kv_elems = 0, lse_elems = 0;
  size_t flush_bytes = 256u << 20;
  unsigned long long pairs = 0;  // unmasked (query, key) pairs, summed over B·H
  double flops = 0;              // the forward's: 2·(D+Dv)·pairs

  // The dmattn row: its arguments (kept: the backward re-runs the forward for
  // its O and LSE), its median time and its output (the other rows of ours
  // must match it bit for bit).
  DmaForwardArgs fwd;
  double fwd_ms = 0;
  std::vector<uint16_t> fwd_output;
  double given_ms = 0;         // the mask-summary-given row's time (0: no row)
  DynamicMaskProblem p_bits;   // p with the bit-packed mask (--mask-bits)
  DmaForwardArgs fwd_bits;
  double bits_ms = 0;          // the bit-packed row's time (0: no row)

  std::vector<DmaRow> rows;
  int failures = 0;

  // time_calls with the run's warm-up, iterations and L2 flush.
  std::string time(const std::function<std::string()>& call, Timing* out) const {
    return time_calls(call, opt.warmup, opt.iters, flush, flush_bytes, stream, out);
  }
};

DmaCore core_option(const std::string& s) {
  return s == "mma"              ? DmaCore::kMma
         : s == "wgmma"          ? DmaCore::kWgmma
         : s == "wgmma-cp.async" ? DmaCore::kWgmmaCpAsync
         : s == "gather"         ? DmaCore::kGather
                                 : DmaCore::kAuto;
}

DmaMaskScan mask_scan_option(const std::string& s) {
  return s == "prepass"     ? DmaMaskScan::kPrepass
         : s == "in-kernel" ? DmaMaskScan::kInKernel
         : s == "pipelined" ? DmaMaskScan::kPipelined
                            : DmaMaskScan::kAuto;
}

// " W=1024 block=64" for --mask topk, else "".
std::string topk_words(const DynamicMaskOptions& dm) {
  return dm.mask == "topk" ? " W=" + std::to_string(dm.window) + " block=" + std::to_string(dm.block) : "";
}

// ==== set-up ==========================================================================

// The problem from the options; the device buffers; the forward's kernel
// checked against this GPU (exit 2 before anything runs); then Q, K, V and
// the bias filled from the seed, the mask built, and the unmasked pairs
// counted (the numerator of every row's effective TFLOPS).
RunError set_up(DmaRun& run) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskOptions& dm = run.dm;
  DynamicMaskProblem& p = run.p;
  p.B = opt.B;
  p.H = opt.H;
  p.Hkv = opt.Hkv > 0 ? opt.Hkv : opt.H;
  p.Nq = opt.Nq;
  p.Nk = opt.Nk;
  p.D = opt.D;
  p.dtype = opt.dtype;
  p.causal = opt.causal;
  p.scale = default_scale(opt.D);
  p.softcap = dm.softcap;
  run.q_elems = int64_t(p.B) * p.H * p.Nq * p.D;
  run.kv_elems = int64_t(p.B) * p.Hkv * p.Nk * p.D;
  run.lse_elems = int64_t(p.B) * p.H * p.Nq;

  DeviceArena& arena = run.arena;
  std::string err;
  if (err.empty()) err = arena.alloc(size_t(run.q_elems) * 2, reinterpret_cast<uint8_t**>(&run.q), "Q");
  if (err.empty()) err = arena.alloc(size_t(run.kv_elems) * 2, reinterpret_cast<uint8_t**>(&run.k), "K");
  if (err.empty()) err = arena.alloc(size_t(run.kv_elems) * 2, reinterpret_cast<uint8_t**>(&run.v), "V");
  if (err.empty()) err = arena.alloc(size_t(run.q_elems) * 2, reinterpret_cast<uint8_t**>(&run.o), "O");
  if (err.empty()) err = arena.alloc(size_t(run.lse_elems), &run.lse, "LSE");
  if (err.empty()) err = arena.alloc(size_t(3), &run.counters, "counters");
  if (err.empty()) err = arena.alloc(run.flush_bytes, reinterpret_cast<uint8_t**>(&run.flush), "the L2 flush");
  if (err.empty() && dm.bias)
    err = arena.alloc(size_t(p.B) * p.Hkv * p.Nk * 2, reinterpret_cast<uint8_t**>(&run.bias), "the bias");
  if (err.empty() && (dm.mask == "topk" || dm.mask == "ones"))
    err = arena.alloc(size_t(p.B) * p.Hkv * p.Nq * p.Nk, &run.mask, "the mask");
  if (!err.empty()) return err;
  if (run.bias) {
    p.bias.data = run.bias;
    p.bias.set_shape(p.B, p.Hkv, 1, p.Nk, p.H);  // flash-dmattn's (B, Hkv, 1, Nk)
  }
  if (run.mask) {
    p.mask.data = run.mask;
    p.mask.set_shape(p.B, p.Hkv, p.Nq, p.Nk, p.H);
  }

  // The forward's tensor-core path, where the problem runs at all: a core this
  // GPU or this shape cannot take is an option error.
  if (dma_forward_unsupported(p).empty() && dma_forward_core_name(p, core_option(dm.dma_core)).empty())
    return {dm.dma_core == "gather"
                ? "dmattn: --dma-core gather needs one query row (--Nq 1) and a mask"
                : "dmattn: --dma-core " + dm.dma_core +
                      " needs an sm_90 GPU, a build with sm_90a code and D in {64, 128}",
            kExitBadOptions};

  const cudaStream_t stream = run.stream;
  const uint64_t seed = run.seed;
  cudaError_t e = fill_random_normal(run.q, run.q_elems, p.dtype, seed * 5 + 0, stream);
  if (e == cudaSuccess) e = fill_random_normal(run.k, run.kv_elems, p.dtype, seed * 5 + 1, stream);
  if (e == cudaSuccess) e = fill_random_normal(run.v, run.kv_elems, p.dtype, seed * 5 + 2, stream);
  if (e == cudaSuccess && run.bias)
    e = fill_random_normal(run.bias, int64_t(p.B) * p.Hkv * p.Nk, p.dtype, seed * 5 + 3, stream);
  if (e == cudaSuccess && run.mask) {
    if (dm.mask == "ones") {
      e = cudaMemsetAsync(run.mask, 1, size_t(p.B) * p.Hkv * p.Nq * p.Nk, stream);
    } else {
      e = dma_build_topk_mask(p, dm.window, dm.block, run.mask, stream);
      if (e == cudaErrorInvalidValue)
        return {"the top-W mask builder cannot take Nk=" + std::to_string(p.Nk) + " on this GPU", kExitBadOptions};
    }
  }
  if (e == cudaSuccess) e = cudaMemsetAsync(run.counters, 0, 3 * sizeof(unsigned long long), stream);
  if (e == cudaSuccess) e = dma_count_visible_pairs(p, run.counters + 2, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("preparing inputs", e);
  cudaMemcpy(&run.pairs, run.counters + 2, sizeof run.pairs, cudaMemcpyDeviceToHost);
  run.flops = 2.0 * (p.D + p.D) * double(run.pairs);  // 2·(D+Dv)·pairs; pairs summed over B·H
  return {};
}

// ==== the forward rows of ours ========================================================

// Unless --no-check: the dmattn row's O and LSE against the fp32 reference, by the
// harness's rule (the same-precision unfused path, S and P rounded to the
// input dtype, as the baseline). Sets the row's status and errors.
RunError check_forward(DmaRun& run, DmaRow& row) {
  const DynamicMaskProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  if (p.Nk > dma_reference_max_nk()) {
    row.note += "; not checked: the reference takes Nk <= " + std::to_string(dma_reference_max_nk());
    return {};
  }
  float *o_ref = nullptr, *lse_ref = nullptr, *o_lp = nullptr, *lse_lp = nullptr;
  std::string err;
  if (err.empty()) err = run.arena.alloc(size_t(run.q_elems), &o_ref, "the reference");
  if (err.empty()) err = run.arena.alloc(size_t(run.lse_elems), &lse_ref, "the reference LSE");
  if (err.empty()) err = run.arena.alloc(size_t(run.q_elems), &o_lp, "the low-precision reference");
  if (err.empty()) err = run.arena.alloc(size_t(run.lse_elems), &lse_lp, "the low-precision LSE");
  if (!err.empty()) return err;
  cudaError_t e = dma_reference_fp32(p, run.q, run.k, run.v, o_ref, lse_ref, false, stream);
  if (e == cudaSuccess) e = dma_reference_fp32(p, run.q, run.k, run.v, o_lp, lse_lp, true, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("dmattn reference", e);
  const ErrorStats base = compare_output_fp32(o_lp, o_ref, run.q_elems, stream);
  const ErrorStats mine = compare_output(run.o, p.dtype, o_ref, run.q_elems, stream);
  const ErrorStats lse_stats = compare_lse(run.lse, lse_ref, run.lse_elems, stream);
  const double rounding = output_rounding_error(o_ref, run.q_elems, p.dtype, stream);
  const CheckResult c = judge(mine, lse_stats, base.max_abs_err, rounding);
  row.err = c.err;
  row.tol = c.tol;
  row.lse_err = c.lse_err;
  row.status = c.pass ? "PASS" : "FAIL";
  row.note = c.summary() + "; " + row.note;
  if (!c.pass) ++run.failures;
  return {};
}

// The dmattn row: one run into poisoned output (counting the 64x64 tiles it
// runs), the check, then the timed runs. Keeps its arguments and output for
// the rows after it.
RunError forward_row(DmaRun& run) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskOptions& dm = run.dm;
  const DynamicMaskProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  DmaRow ours;
  ours.name = "dmattn";
  if (std::string why = dma_forward_unsupported(p); !why.empty()) {
    ours.status = "unsupported";
    ours.note = why;
    run.rows.push_back(ours);
    return {};
  }
  DmaForwardArgs& a = run.fwd;
  a.q = run.q;
  a.k = run.k;
  a.v = run.v;
  a.o = run.o;
  a.lse = run.lse;
  a.tile_counters = run.counters;
  a.splits = dma_resolve_splits(p, dm.splits);
  a.core = core_option(dm.dma_core);
  a.mask_scan = mask_scan_option(dm.dma_mask_scan);
  a.prepass_chunks = dm.dma_prepass_chunks;
  const std::string core = dma_forward_core_name(p, a.core);  // not empty: set_up checked it
  if (dma_forward_workspace_bytes(p, a.splits) > 0) {  // the mask summary and/or the split partials
    a.workspace_bytes = dma_forward_workspace_bytes(p, a.splits);
    if (std::string e = run.arena.alloc(a.workspace_bytes / sizeof(float), &a.workspace, "the forward workspace");
        !e.empty())
      return e;
  }
  cudaMemsetAsync(run.o, 0xFF, size_t(run.q_elems) * 2, stream);
  cudaMemsetAsync(run.lse, 0xFF, size_t(run.lse_elems) * 4, stream);
  cudaError_t e = dma_forward(p, a, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("dmattn", e);
  unsigned long long tiles[2] = {0, 0};
  cudaMemcpy(tiles, run.counters, sizeof tiles, cudaMemcpyDeviceToHost);
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
  if (opt.check)
    if (RunError c = check_forward(run, ours); c.failed()) return c;
  Timing timing;
  if (std::string t = run.time(
          [&] {
            const cudaError_t r = dma_forward(p, a, stream);
            return r == cudaSuccess ? std::string() : cuda_error_text("dmattn", r);
          },
          &timing);
      !t.empty())
    return t;
  ours.ms = timing.median_ms;
  ours.tflops = run.flops / (ours.ms * 1e-3) / 1e12;
  run.rows.push_back(ours);
  run.fwd_ms = ours.ms;
  // Its timed calls wrote O last.
  run.fwd_output.resize(static_cast<size_t>(run.q_elems));
  cudaMemcpy(run.fwd_output.data(), run.o, run.fwd_output.size() * 2, cudaMemcpyDeviceToHost);
  return {};
}

// A row of ours run another way on the same problem (the summary given, the
// mask as bits): one run into poisoned output, compared bit for bit with the
// dmattn row's, then timed; fills the row's ms, TFLOPS and status.
RunError bitwise_row(DmaRun& run, DmaRow& row, const DynamicMaskProblem& rp, const DmaForwardArgs& ra) {
  const cudaStream_t stream = run.stream;
  std::vector<uint16_t> out(static_cast<size_t>(run.q_elems));
  cudaError_t r = cudaMemsetAsync(run.o, 0xFF, size_t(run.q_elems) * 2, stream);
  if (r == cudaSuccess) r = dma_forward(rp, ra, stream);
  if (r == cudaSuccess) r = cudaStreamSynchronize(stream);
  if (r == cudaSuccess) r = cudaMemcpy(out.data(), run.o, out.size() * 2, cudaMemcpyDeviceToHost);
  if (r != cudaSuccess) return cuda_error_text(row.name.c_str(), r);
  const bool same = out == run.fwd_output;
  if (!same) ++run.failures;
  Timing timing;
  if (std::string t = run.time(
          [&] {
            const cudaError_t e = dma_forward(rp, ra, stream);
            return e == cudaSuccess ? std::string() : cuda_error_text(row.name.c_str(), e);
          },
          &timing);
      !t.empty())
    return t;
  row.ms = timing.median_ms;
  row.tflops = run.flops / (row.ms * 1e-3) / 1e12;
  row.status = same ? "PASS" : "FAIL";
  return {};
}

// "dmattn (mask summary given)": for a mask used more than once (forward after
// forward; layers or calls sharing it), dma_build_mask_summary once, outside
// the timed calls (its own time is in the note), then forwards that scan
// nothing (DmaForwardArgs::mask_summary). Not for the gather core, which
// lists its row's keys itself.
RunError summary_given_row(DmaRun& run) {
  const DynamicMaskProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  if (run.fwd_ms <= 0 || p.mask.data == nullptr || dma_forward_core_name(p, run.fwd.core) == "gather") return {};
  DmaRow row;
  row.name = "dmattn (mask summary given)";
  uint32_t* summary = nullptr;
  if (std::string e = run.arena.alloc((dma_mask_summary_bytes(p) + 15) / 16 * 4, &summary, "the mask summary");
      !e.empty())
    return e;
  Timing build_timing;
  if (std::string t = run.time(
          [&] {
            const cudaError_t r = dma_build_mask_summary(p, summary, stream);
            return r == cudaSuccess ? std::string() : cuda_error_text("dma_build_mask_summary", r);
          },
          &build_timing);
      !t.empty())
    return t;
  DmaForwardArgs given = run.fwd;
  given.mask_summary = summary;
  if (RunError t = bitwise_row(run, row, p, given); t.failed()) return t;
  run.given_ms = row.ms;
  char note[240];
  std::snprintf(note, sizeof note,
                "%s the dmattn row's output; no mask scan: the summary built once beforehand by "
                "dma_build_mask_summary (%.4f ms, not in this time)",
                row.status == "PASS" ? "bitwise equal to" : "DIFFERS from", build_timing.median_ms);
  row.note = note;
  run.rows.push_back(row);
  return {};
}

// "dmattn (bit-packed mask)", with --mask-bits: the same mask as one bit per
// (query, key) (DmaMaskFormat::kBits), packed once by dma_pack_mask_bits
// outside the timed calls (its own time is in the note) — a mask builder
// could write it so directly. The scan reads an eighth of the bytes.
RunError bit_packed_row(DmaRun& run) {
  const DynamicMaskProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  if (!run.dm.mask_bits || run.fwd_ms <= 0 || p.mask.data == nullptr) return {};
  DmaRow row;
  row.name = "dmattn (bit-packed mask)";
  uint32_t* bits = nullptr;
  if (std::string e = run.arena.alloc(dma_mask_bits_bytes(p) / 4 + 2, &bits, "the bit-packed mask"); !e.empty())
    return e;
  Timing pack_timing;
  if (std::string t = run.time(
          [&] {
            const cudaError_t r = dma_pack_mask_bits(p, bits, stream);
            return r == cudaSuccess ? std::string() : cuda_error_text("dma_pack_mask_bits", r);
          },
          &pack_timing);
      !t.empty())
    return t;
  run.p_bits = dma_with_bit_mask(p, bits);
  run.fwd_bits = run.fwd;
  const DynamicMaskProblem& pb = run.p_bits;
  const DmaForwardArgs& ab = run.fwd_bits;
  if (RunError t = bitwise_row(run, row, pb, ab); t.failed()) return t;
  run.bits_ms = row.ms;
  char note[300];
  std::snprintf(note, sizeof note,
                "%s the dmattn row's output; the mask as bits (%.1f MiB instead of %.1f), packed once beforehand by "
                "dma_pack_mask_bits (%.4f ms, not in this time); mask scan %s",
                row.status == "PASS" ? "bitwise equal to" : "DIFFERS from", double(dma_mask_bits_bytes(p)) / (1 << 20),
                double(p.mask.elems(p.Nk)) / (1 << 20), pack_timing.median_ms,
                dma_forward_mask_scan_name(pb, ab.mask_scan, ab.splits, ab.core).c_str());
  row.note = note;
  run.rows.push_back(row);
  return {};
}

// ==== the peers =======================================================================

// "split-q+stage2 (dense)": rung 02 on the same Q, K, V (and KV heads)
// without mask or bias, timed only.
RunError dense_rung_row(DmaRun& run) {
  const DynamicMaskProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  DmaRow dense;
  dense.name = "split-q+stage2 (dense)";
  const Variant* rung = find_variant<Variant>("split-q+stage2");
  const AttnProblem dp = p.dense();
  if (rung == nullptr || !rung->unsupported_reason(dp).empty()) {
    dense.status = "unsupported";
    dense.note = rung ? rung->unsupported_reason(dp) : "split-q+stage2 is not registered";
  } else {
    AttnBuffers b;
    b.q = run.q;
    b.k = run.k;
    b.v = run.v;
    b.o = run.o;
    b.lse = run.lse;
    Timing timing;
    if (std::string t = run.time(
            [&] {
              const cudaError_t r = rung->launch(dp, b, stream);
              return r == cudaSuccess ? std::string() : cuda_error_text("split-q+stage2", r);
            },
            &timing);
        !t.empty())
      return t;
    dense.ms = timing.median_ms;
    dense.tflops = run.flops / (dense.ms * 1e-3) / 1e12;
    dense.status = "unchecked";
    char note[160];
    std::snprintf(note, sizeof note, "no mask or bias; its own dense TFLOPS %.1f; dmattn / dense speed %.2fx",
                  forward_flops(dp) / (dense.ms * 1e-3) / 1e12, run.fwd_ms > 0 ? dense.ms / run.fwd_ms : 0.0);
    dense.note = note;
  }
  run.rows.push_back(dense);
  return {};
}

// One row per torch peer: its first call builds its graph (untimed), then the
// timed calls; a peer that cannot run is an unsupported row, and a set-up
// that failed is one row named `setup_row`. The notes compare each with our
// row `ours_name` (`ours_ms`), saying whether torch had the mask, and, where
// they ran, with the summary-given and bit-packed rows; an unmasked row of a
// masked run also gives its own dense TFLOPS (`dense_flops` over its time).
void torch_rows(DmaRun& run, const std::vector<MaskedTorchPeer>& peers, const std::string& setup,
                const std::string& setup_row, double row_flops, double dense_flops, double ours_ms,
                const char* ours_name, double row_given_ms, double row_bits_ms) {
  const bool masked_run = run.p.mask.data != nullptr || run.p.bias.data != nullptr;
  const cudaStream_t stream = run.stream;
  if (!setup.empty()) {
    DmaRow r;
    r.name = setup_row;
    r.kind = "peer";
    r.status = "unsupported";
    r.note = setup;
    run.rows.push_back(r);
  }
  for (const MaskedTorchPeer& peer : peers) {
    DmaRow r;
    r.name = peer.name;
    r.kind = "peer";
    Timing timing;
    std::string t = peer.run(stream);
    if (t.empty()) t = run.time([&] { return peer.run(stream); }, &timing);
    if (!t.empty()) {
      r.status = "unsupported";
      r.note = t;
      cudaGetLastError();
    } else {
      r.ms = timing.median_ms;
      r.tflops = row_flops / (r.ms * 1e-3) / 1e12;
      r.status = "unchecked";
      r.note = std::string(ours_name) + " is " + faster_or_slower(ours_ms > 0 ? r.ms / ours_ms : 0.0) + " than " +
               peer.name + " (" + (peer.masked ? "masked" : "no mask") + ")";
      if (row_given_ms > 0) r.note += " (with the mask summary given: " + faster_or_slower(r.ms / row_given_ms) + ")";
      if (row_bits_ms > 0) r.note += " (with the bit-packed mask: " + faster_or_slower(r.ms / row_bits_ms) + ")";
      if (!peer.masked && masked_run) {
        char note[64];
        std::snprintf(note, sizeof note, "; its own dense TFLOPS %.1f", dense_flops / (r.ms * 1e-3) / 1e12);
        r.note += note;
      }
      if (!peer.about.empty()) r.note += "; " + peer.about;
    }
    run.rows.push_back(r);
  }
}

// Whether torch's rows run: by default where the build has torch (--torch or
// --sdpa ask for them, and --no-peers drops them).
bool torch_rows_wanted(const CommonOptions& opt) {
  return (opt.sdpa || opt.torch) && (have_torch() || opt.peers_given);
}

// Torch's forward given the same mask and bias.
void torch_forward_rows(DmaRun& run) {
  if (!torch_rows_wanted(run.opt)) return;
  std::string setup;
  const std::vector<MaskedTorchPeer> peers = make_masked_torch_peers(run.p, run.q, run.k, run.v, &setup);
  torch_rows(run, peers, setup, "torch+mask", run.flops, forward_flops(run.p.dense()), run.fwd_ms, "dmattn",
             run.given_ms, run.bits_ms);
}

// ==== the backward rows ===============================================================

// The backward's buffers, its arguments and (when checked) the gradients of
// the fp32 reference and of the same-precision one.
struct DmaBackward {
  void *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dbias = nullptr;
  float* workspace = nullptr;
  int64_t bias_elems = 0;
  int chunks = 0;  // the query chunks it launches
  DmaBackwardArgs args;
  double flops = 0;  // 2·(3D+2Dv)·pairs
  float *rq = nullptr, *rk = nullptr, *rv = nullptr, *rb = nullptr;  // fp32 reference
  float *lq = nullptr, *lk = nullptr, *lv = nullptr, *lb = nullptr;  // same precision
  bool has_reference() const { return rq != nullptr; }
};

// dO filled from the seed, the gradient buffers and the workspace, and the
// arguments. As in training, where the forward stored the mask's tile bits
// (its pre-pass, or its in-kernel scan with one split) the backward reads
// them instead of running its own pre-pass (the forward's workspace is not
// touched between the forward and these calls); --bwd-own-prepass: the
// backward alone, its own pre-pass timed with it.
RunError set_up_backward(DmaRun& run, DmaBackward& g) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskOptions& dm = run.dm;
  const DynamicMaskProblem& p = run.p;
  g.bias_elems = p.bias.data ? p.bias.elems(p.Nk) : 0;
  g.chunks = dma_backward_resolve_chunks(p, opt.deterministic, dm.bwd_chunks);
  const size_t ws_bytes = dma_backward_workspace_bytes(p, opt.deterministic, g.chunks);
  g.flops = 2.0 * (3 * p.D + 2 * p.D) * double(run.pairs);
  DeviceArena& arena = run.arena;
  std::string e;
  if (e.empty()) e = arena.alloc(size_t(run.q_elems) * 2, reinterpret_cast<uint8_t**>(&g.dout), "dO");
  if (e.empty()) e = arena.alloc(size_t(run.q_elems) * 2, reinterpret_cast<uint8_t**>(&g.dq), "dQ");
  if (e.empty()) e = arena.alloc(size_t(run.kv_elems) * 2, reinterpret_cast<uint8_t**>(&g.dk), "dK");
  if (e.empty()) e = arena.alloc(size_t(run.kv_elems) * 2, reinterpret_cast<uint8_t**>(&g.dv), "dV");
  if (e.empty() && g.bias_elems)
    e = arena.alloc(size_t(g.bias_elems) * 2, reinterpret_cast<uint8_t**>(&g.dbias), "dBias");
  if (e.empty()) e = arena.alloc(ws_bytes / sizeof(float) + 1, &g.workspace, "the backward workspace");
  if (!e.empty()) return e;
  if (cudaError_t r = fill_random_normal(g.dout, run.q_elems, p.dtype, run.seed * 5 + 4, run.stream); r != cudaSuccess)
    return cuda_error_text("dO", r);
  DmaBackwardArgs& ba = g.args;
  ba.q = run.q;
  ba.k = run.k;
  ba.v = run.v;
  ba.o = run.o;
  ba.lse = run.lse;
  ba.dout = g.dout;
  ba.dq = g.dq;
  ba.dk = g.dk;
  ba.dv = g.dv;
  ba.dbias = g.dbias;
  ba.workspace = g.workspace;
  ba.workspace_bytes = ws_bytes;
  ba.deterministic = opt.deterministic;
  ba.rotate_slots = dm.bwd_rotate;
  ba.q_chunks = dm.bwd_chunks;  // as asked (0: automatic, which may plan the chunks on the device)
  ba.core = dm.dma_core == "mma" ? DmaCore::kMma : dm.dma_core == "auto" ? DmaCore::kAuto : DmaCore::kWgmma;
  ba.mask_summary = dm.bwd_own_prepass ? nullptr : dma_forward_mask_summary(p, run.fwd);
  return {};
}

// The reference gradients, unless --no-check, where the reference takes Nk.
RunError backward_references(DmaRun& run, DmaBackward& g) {
  const DynamicMaskProblem& p = run.p;
  if (!run.opt.check || p.Nk > dma_reference_backward_max_nk()) return {};
  const size_t nb = size_t(std::max<int64_t>(1, g.bias_elems));
  DeviceArena& arena = run.arena;
  std::string e;
  if (e.empty()) e = arena.alloc(size_t(run.q_elems), &g.rq, "the reference dQ");
  if (e.empty()) e = arena.alloc(size_t(run.kv_elems), &g.rk, "the reference dK");
  if (e.empty()) e = arena.alloc(size_t(run.kv_elems), &g.rv, "the reference dV");
  if (e.empty()) e = arena.alloc(nb, &g.rb, "the reference dBias");
  if (e.empty()) e = arena.alloc(size_t(run.q_elems), &g.lq, "the same-precision dQ");
  if (e.empty()) e = arena.alloc(size_t(run.kv_elems), &g.lk, "the same-precision dK");
  if (e.empty()) e = arena.alloc(size_t(run.kv_elems), &g.lv, "the same-precision dV");
  if (e.empty()) e = arena.alloc(nb, &g.lb, "the same-precision dBias");
  if (!e.empty()) return e;
  cudaError_t r = dma_reference_backward_fp32(p, run.q, run.k, run.v, g.dout, g.rq, g.rk, g.rv,
                                              g.bias_elems ? g.rb : nullptr, run.stream);
  if (r == cudaSuccess)
    r = dma_reference_backward_fp32(p, run.q, run.k, run.v, g.dout, g.lq, g.lk, g.lv, g.bias_elems ? g.lb : nullptr,
                                    run.stream, /*low_precision=*/true);
  if (r == cudaSuccess) r = cudaStreamSynchronize(run.stream);
  if (r != cudaSuccess) return cuda_error_text("dmattn reference backward", r);
  return {};
}

// The rule, per gradient: max |g - g_ref| <= 2 x the error of the
// same-precision reference (S, P, dP, dS rounded to the dtype) + 1e-3 x
// max |g_ref| + 1e-4. Adds "dQ err/tol" to *summary; false on a failure.
bool judge_grad(const DmaRun& run, const char* what, const void* grad, const float* ref, const float* lp, int64_t n,
                std::string* summary) {
  std::vector<float> host(static_cast<size_t>(n));
  cudaMemcpy(host.data(), ref, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost);
  double scale = 0;
  for (float x : host) scale = std::max(scale, double(std::fabs(x)));
  const ErrorStats s = compare_output(grad, run.p.dtype, ref, n, run.stream);
  const ErrorStats base = compare_output_fp32(lp, ref, n, run.stream);
  const double tol = 2 * base.max_abs_err + 1e-3 * scale + 1e-4;
  const bool ok = s.nonfinite == 0 && s.max_abs_err <= tol;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%s %.1e/%.1e", summary->empty() ? "" : ", ", what, s.max_abs_err, tol);
  *summary += buf;
  return ok;
}

// Judges dQ, dK, dV (and dBias) against the references: sets the row's status
// and starts its note.
void judge_grads(DmaRun& run, const DmaBackward& g, DmaRow& row) {
  std::string summary;
  bool pass = judge_grad(run, "dQ", g.dq, g.rq, g.lq, run.q_elems, &summary);
  pass = judge_grad(run, "dK", g.dk, g.rk, g.lk, run.kv_elems, &summary) && pass;
  pass = judge_grad(run, "dV", g.dv, g.rv, g.lv, run.kv_elems, &summary) && pass;
  if (g.bias_elems) pass = judge_grad(run, "dBias", g.dbias, g.rb, g.lb, g.bias_elems, &summary) && pass;
  row.status = pass ? "PASS" : "FAIL";
  row.note = summary + " (err/tol: 2 x same-precision err + floor); ";
  if (!pass) ++run.failures;
}

// dQ, dK, dV (and dBias) as bytes, for the bitwise comparisons.
std::vector<uint8_t> grad_bytes(const DmaRun& run, const DmaBackward& g) {
  const int64_t q = run.q_elems, kv = run.kv_elems;
  std::vector<uint8_t> h(size_t(2 * q + 4 * kv + 2 * g.bias_elems));
  cudaMemcpy(h.data(), g.dq, size_t(q) * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data() + 2 * q, g.dk, size_t(kv) * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data() + 2 * q + 2 * kv, g.dv, size_t(kv) * 2, cudaMemcpyDeviceToHost);
  if (g.bias_elems) cudaMemcpy(h.data() + 2 * q + 4 * kv, g.dbias, size_t(g.bias_elems) * 2, cudaMemcpyDeviceToHost);
  return h;
}

// The end of the backward row's note: the query chunks walked, the core, where
// its mask summary came from, and the FLOP count.
std::string backward_note(const DmaRun& run, const DmaBackward& g) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskOptions& dm = run.dm;
  const DynamicMaskProblem& p = run.p;
  const DmaForwardArgs& a = run.fwd;
  const int walked = dma_backward_walked_chunks(p, opt.deterministic, dm.bwd_chunks, g.workspace);
  return "q chunks " + std::to_string(walked) +
         (!dma_backward_plans_chunks(p, opt.deterministic, dm.bwd_chunks) ? ""
          : walked == g.chunks ? " (the chunk plan kept them: skewed)"
                               : " (of " + std::to_string(g.chunks) + " launched: the chunk plan found the slots even)") +
         (g.args.rotate_slots ? "" : "; query tiles in order") + "; core " + dma_backward_core_name(p, g.args.core) +
         (p.mask.data == nullptr ? ""
          : g.args.mask_summary != nullptr
              ? (a.mask_summary != nullptr ? std::string("; mask summary: the one given to the forward")
                                           : "; mask summary: the forward's " +
                                                 dma_forward_mask_scan_name(p, a.mask_scan, a.splits, a.core)) +
                    " (the mask not read again)"
              : "; mask summary: its own pre-pass (the mask read again, in this time)") +
         "; TFLOPS count 2·(3D+2Dv)·unmasked pairs";
}

// "dmattn bwd": one run, checked against the references (unless --no-check),
// then timed; in deterministic mode (when checked) the gradients after the timed
// runs must equal the first run's bit for bit (every run rewrites them).
RunError backward_row(DmaRun& run, DmaBackward& g, DmaRow& bwd) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  cudaError_t e = dma_backward(p, g.args, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("dmattn backward", e);
  bwd.status = "unchecked";
  if (RunError r = backward_references(run, g); r.failed()) return r;
  if (g.has_reference()) judge_grads(run, g, bwd);
  const std::vector<uint8_t> first = opt.deterministic && opt.check ? grad_bytes(run, g) : std::vector<uint8_t>{};
  Timing timing;
  if (std::string t = run.time(
          [&] {
            const cudaError_t r = dma_backward(p, g.args, stream);
            return r == cudaSuccess ? std::string() : cuda_error_text("dmattn backward", r);
          },
          &timing);
      !t.empty())
    return t;
  if (!first.empty()) {
    const bool same = grad_bytes(run, g) == first;
    bwd.note += same ? "bitwise identical over " + std::to_string(1 + opt.warmup + opt.iters) + " runs; "
                     : "NOT bitwise identical across runs; ";
    if (!same) {
      bwd.status = "FAIL";
      ++run.failures;
    }
  }
  bwd.ms = timing.median_ms;
  bwd.tflops = g.flops / (bwd.ms * 1e-3) / 1e12;
  bwd.note += backward_note(run, g);
  run.rows.push_back(bwd);
  return {};
}

// "dmattn bwd (bit-packed mask)", with --mask-bits: the same backward on the
// bit-packed mask, after a forward on it (whose summary it reads, as the byte
// row does); checked against the same references and, in deterministic mode,
// bitwise against the byte row's gradients. Returns its time in *ms (0: no
// row).
RunError bit_packed_backward_row(DmaRun& run, DmaBackward& g, const std::string& byte_row_name, double* ms) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskOptions& dm = run.dm;
  const cudaStream_t stream = run.stream;
  *ms = 0;
  if (!dm.mask_bits || run.bits_ms <= 0) return {};
  const DynamicMaskProblem& pb = run.p_bits;
  DmaRow brow;
  brow.name = byte_row_name + " (bit-packed mask)";
  DmaBackwardArgs bb = g.args;
  bb.mask_summary = dm.bwd_own_prepass ? nullptr : dma_forward_mask_summary(pb, run.fwd_bits);
  const std::vector<uint8_t> bytes_grads = opt.deterministic ? grad_bytes(run, g) : std::vector<uint8_t>{};
  cudaError_t e = dma_forward(pb, run.fwd_bits, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(g.dq, 0xFF, size_t(run.q_elems) * 2, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(g.dk, 0xFF, size_t(run.kv_elems) * 2, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(g.dv, 0xFF, size_t(run.kv_elems) * 2, stream);
  if (e == cudaSuccess) e = dma_backward(pb, bb, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("dmattn backward (bit-packed mask)", e);
  brow.status = "unchecked";
  if (g.has_reference()) judge_grads(run, g, brow);
  if (!bytes_grads.empty()) {
    const bool same = grad_bytes(run, g) == bytes_grads;
    brow.note += same ? "bitwise identical to the byte mask's gradients; " : "DIFFERS from the byte mask's gradients; ";
    if (!same) {
      brow.status = "FAIL";
      ++run.failures;
    }
  }
  Timing timing;
  if (std::string t = run.time(
          [&] {
            const cudaError_t r = dma_backward(pb, bb, stream);
            return r == cudaSuccess ? std::string() : cuda_error_text("dmattn backward (bit-packed mask)", r);
          },
          &timing);
      !t.empty())
    return t;
  *ms = timing.median_ms;
  brow.ms = *ms;
  brow.tflops = g.flops / (brow.ms * 1e-3) / 1e12;
  brow.note += bb.mask_summary != nullptr
                   ? "mask summary: the bit-packed forward's " +
                         dma_forward_mask_scan_name(pb, run.fwd_bits.mask_scan, run.fwd_bits.splits, run.fwd_bits.core)
                   : std::string("mask summary: its own pre-pass of the bits, in this time");
  run.rows.push_back(brow);
  return {};
}

// With --bwd, after the dmattn row ran: the forward once more (the rows since
// wrote over O and LSE), then ours, ours on the bit-packed mask, and torch's
// backward through autograd with the same mask (or, with no mask and no
// bias, plain). Given a mask or bias that leaves every pair active (a bias
// alone, --mask causal or ones), the SDPA peers add FA2's backward without
// them, at the same pair count.
RunError backward_rows(DmaRun& run) {
  const CommonOptions& opt = run.opt;
  const DynamicMaskOptions& dm = run.dm;
  const DynamicMaskProblem& p = run.p;
  if (!opt.bwd || run.fwd_ms <= 0) return {};
  if (cudaError_t r = dma_forward(p, run.fwd, run.stream); r != cudaSuccess) return cuda_error_text("dmattn", r);
  DmaRow bwd;
  bwd.name = "dmattn bwd";
  if (std::string why = dma_backward_unsupported(p); !why.empty()) {
    bwd.status = "unsupported";
    bwd.note = why;
    run.rows.push_back(bwd);
    return {};
  }
  DmaBackward g;
  if (RunError r = set_up_backward(run, g); r.failed()) return r;
  if (opt.deterministic) bwd.name += " (deterministic)";
  if (RunError r = backward_row(run, g, bwd); r.failed()) return r;
  double bits_ms = 0;
  if (RunError r = bit_packed_backward_row(run, g, bwd.name, &bits_ms); r.failed()) return r;
  if (torch_rows_wanted(opt)) {
    std::string setup;
    const bool all_active = dm.mask == "none" || dm.mask == "causal" || dm.mask == "ones";
    const std::vector<MaskedTorchPeer> peers =
        make_masked_torch_peers(p, run.q, run.k, run.v, &setup, g.dout, opt.sdpa && all_active);
    torch_rows(run, peers, setup, "torch+mask bwd", g.flops, backward_flops(p.dense()), bwd.ms, "dmattn bwd", 0,
               bits_ms);
  }
  return {};
}

// ==== the report ======================================================================

// The line above the rows: the shape, the mask and the unmasked pairs.
void print_banner(const DmaRun& run) {
  const DynamicMaskOptions& dm = run.dm;
  const DynamicMaskProblem& p = run.p;
  std::printf("%s\n", std::string(150, '-').c_str());
  std::printf("dynamic-mask attention: %s; mask %s%s; unmasked pairs %llu (%.2f%% of Nq·Nk·B·H); seed %llu\n",
              p.shape_string().c_str(), dm.mask.c_str(), topk_words(dm).c_str(),
              run.pairs, 100.0 * double(run.pairs) / (double(p.B) * p.H * p.Nq * p.Nk),
              (unsigned long long)run.seed);
}

// One line per row, then the machine.
void print_rows(const std::vector<DmaRow>& rows, const SystemInfo& sys) {
  for (const DmaRow& r : rows) {
    if (r.ms > 0)
      std::printf("%32s: time:%.6fms, effective TFLOPS:%-8.2f %-10s %s\n", r.name.c_str(), r.ms, r.tflops,
                  r.status.c_str(), r.note.c_str());
    else
      std::printf("%32s: %s: %s\n", r.name.c_str(), r.status.c_str(), r.note.c_str());
  }
  std::printf("%s | driver %s | CUDA %s | torch %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(),
              sys.cuda.c_str(), torch_version().c_str(), sys.commit.c_str(), sys.date.c_str());
}

// The rows appended to --csv, the shape's mask and bias in each note; returns
// "" or what was lost.
std::string append_csv(const std::string& path, const SystemInfo& sys, const DmaRun& run) {
  const DynamicMaskOptions& dm = run.dm;
  const DynamicMaskProblem& p = run.p;
  double best_peer = 0;
  for (const DmaRow& r : run.rows)
    if (r.kind == "peer" && r.ms > 0) best_peer = std::max(best_peer, r.tflops);
  const std::string shape_note = "Hkv=" + std::to_string(p.Hkv) + "; mask=" + dm.mask +
                                 topk_words(dm) + (dm.bias ? "; bias (B;Hkv;1;Nk)" : "") +
                                 (p.softcap > 0 ? "; softcap " + std::to_string(p.softcap) : "");
  std::ostringstream f;
  for (const DmaRow& r : run.rows) {
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
      << sys.date << ',' << csv_field(r.name) << ',' << r.kind << ',' << p.B << ',' << p.H << ',' << p.Nq << ','
      << p.Nk << ',' << p.D << ',' << p.D << ',' << dtype_name(p.dtype) << ',' << (p.causal ? 1 : 0) << ',' << nums
      << ',' << r.status << ',' << errs << ',' << run.seed << ',' << note << '\n';
  }
  return append_results_csv(path, f.str());
}

int fail(const RunError& e) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", e.message.c_str());
  return e.code;
}

}  // namespace

int run_dynamic_mask_mode(const CommonOptions& opt, const DynamicMaskOptions& dm, const SystemInfo& sys, uint64_t seed,
                          cudaStream_t stream) {
  DmaRun run(opt, dm, seed, stream);
  if (RunError e = set_up(run); e.failed()) return fail(e);
  print_banner(run);
  // Each step appends its rows to run.rows; an error ends the run.
  if (RunError e = forward_row(run); e.failed()) return fail(e);
  if (RunError e = summary_given_row(run); e.failed()) return fail(e);
  if (RunError e = bit_packed_row(run); e.failed()) return fail(e);
  if (RunError e = dense_rung_row(run); e.failed()) return fail(e);
  torch_forward_rows(run);
  if (RunError e = backward_rows(run); e.failed()) return fail(e);

  print_rows(run.rows, sys);
  if (!opt.csv.empty())
    if (std::string e = append_csv(opt.csv, sys, run); !e.empty()) return fail(RunError(e));
  if (run.failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", run.failures, run.failures > 1 ? "s" : "");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace attnlab
