// flash_attn_mma — every attention variant of attnlab on one shape, timed and
// checked side by side with the peers. See README.md for the columns and the
// FLOP convention.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "dmattn_mode.h"
#include "runner.h"
#include "system_info.h"
#include "torch_peers.h"

using namespace attnlab;

namespace {

constexpr int kTableWidth = 150;

struct Row {
  const Variant* variant = nullptr;
  std::string status;  // PASS, FAIL, baseline, unchecked, unsupported, error
  std::string note;    // check summary, the unsupported reason or the error
  RunOutcome outcome;
  Timing timing;
  double tflops = 0;
  double gain_pct = -1;          // over the best row so far; < 0 when not an improvement
  double ratio_to_best_peer = 0; // rungs only; 0 when no peer ran
  bool ran() const { return timing.median_ms > 0; }
};

struct ShapeResult {
  std::vector<Row> rows;
  std::string best_peer_name;
  double best_peer_tflops = 0;
  int failures = 0;
  bool device_lost = false;
  std::string fatal;  // allocation or setup error for the whole shape
};

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", message.c_str());
  return code;
}

// Appends the shape's rows to --csv; returns "" or what was lost.
std::string append_csv(const std::string& path, const SystemInfo& sys, const AttnProblem& p, uint64_t seed,
                       const std::vector<Row>& rows) {
  // The CSV has no Hkv column: a GQA row says it in its note, as the dynamic-mask rows do.
  const std::string kv_note = p.gqa() ? "Hkv=" + std::to_string(p.kv_heads()) + "; " : "";
  std::ostringstream f;
  for (const Row& r : rows) {
    char nums[96] = ",,";
    if (r.ran()) {
      if (r.ratio_to_best_peer > 0)
        std::snprintf(nums, sizeof nums, "%.6f,%.2f,%.3f", r.timing.median_ms, r.tflops, r.ratio_to_best_peer);
      else
        std::snprintf(nums, sizeof nums, "%.6f,%.2f,", r.timing.median_ms, r.tflops);
    }
    char errs[96] = ",,";
    if (r.outcome.checked)
      std::snprintf(errs, sizeof errs, "%.3e,%.3e,%.3e", r.outcome.check.err, r.outcome.check.tol,
                    r.outcome.check.lse_err);
    f << csv_field(sys.gpu) << ',' << csv_field(sys.driver) << ',' << csv_field(sys.cuda) << ',' << sys.commit << ','
      << sys.date << ',' << r.variant->name << ',' << (r.variant->is_peer ? "peer" : "rung") << ',' << p.B << ','
      << p.H << ',' << p.Nq << ',' << p.Nk << ',' << p.D << ',' << p.Dv << ',' << dtype_name(p.dtype) << ','
      << (p.causal ? 1 : 0) << ',' << nums << ',' << r.status << ',' << errs << ',' << seed << ','
      << csv_field(kv_note + r.note) << '\n';
  }
  return append_results_csv(path, f.str());
}

void print_row(const Row& r, const std::string& best_peer_name) {
  const char* name = r.variant->name.c_str();
  if (r.status == "unsupported" || r.status == "error") {
    std::printf("%32s: %s: %s\n", name, r.status.c_str(), r.note.c_str());
    return;
  }
  const float* v = r.outcome.first_values;
  char gain[32] = "";
  if (r.gain_pct >= 0) std::snprintf(gain, sizeof gain, "(+%.2f%%)", r.gain_pct);
  char ratio[64] = "";
  if (r.ratio_to_best_peer > 0) std::snprintf(ratio, sizeof ratio, "%.2fx %s", r.ratio_to_best_peer, best_peer_name.c_str());
  std::printf("%32s: ['%-11.8f', '%-11.8f', '%-11.8f'], time:%.6fms, TFLOPS:%-7.2f%-10s %-22s %s\n", name, v[0], v[1],
              v[2], r.timing.median_ms, r.tflops, gain, ratio, r.outcome.checked ? r.note.c_str() : "");
}

// The unfused baseline: one object, so that run_shape knows its row (the
// yardstick of the check rule, reported as "baseline", not judged by itself).
const Variant& unfused_baseline() {
  static const Variant unfused = make_unfused_baseline();
  return unfused;
}

// Runs every selected row on one problem. `verbose` prints the table of rows.
ShapeResult run_shape(const Options& opt, const AttnProblem& p, const std::vector<const Variant*>& selected,
                      uint64_t seed, cudaStream_t stream, bool verbose) {
  ShapeResult result;
  const Variant& unfused = unfused_baseline();
  // Workspace: the unfused baseline needs S, for all heads ideally, one KV
  // head's (its H / Hkv query heads) at least.
  const size_t s_granule = unfused_workspace_granule(p);
  const bool unfused_listed = std::find(selected.begin(), selected.end(), &unfused) != selected.end();
  const bool unfused_runs = (unfused_listed || opt.check) && unfused.unsupported_reason(p).empty();
  size_t wanted = unfused_runs ? unfused.workspace_bytes(p) : 0;
  for (const Variant* v : selected)
    if (v != &unfused && v->unsupported_reason(p).empty()) wanted = std::max(wanted, v->workspace_bytes(p));
  ProblemBuffers bufs;
  result.fatal = bufs.allocate(p, opt.check, wanted, unfused_runs ? s_granule : 0, unfused_runs ? s_granule : 0);
  if (!result.fatal.empty()) return result;
  ReferenceData ref;
  result.fatal = prepare_inputs(p, bufs, seed, opt.check, stream, &ref, opt.torch_reference);
  if (!result.fatal.empty()) return result;

  if (verbose) {
    char banner[256];
    std::snprintf(banner, sizeof banner, " %s, Warmup: %d, Iters: %d, Seed: %llu ", p.shape_string().c_str(),
                  opt.warmup, opt.iters, static_cast<unsigned long long>(seed));
    const int len = int(std::string(banner).size()), pad = std::max(0, kTableWidth - len) / 2;
    std::printf("%s%s%s\n", std::string(size_t(pad), '-').c_str(), banner,
                std::string(size_t(std::max(0, kTableWidth - pad - len)), '-').c_str());
    if (opt.check) {
      char baseline[32] = "unavailable";
      if (ref.baseline_err >= 0) std::snprintf(baseline, sizeof baseline, "%.2e", ref.baseline_err);
      std::printf("%32s  vs %s; pass: err <= 2 x unfused err (%s) + 2 x rounding (%.2e), lse <= %.0e (unfused: + its S rounding)\n", "check",
                  opt.torch_reference ? "torch fp32 math SDPA" : "fp32 reference", baseline, ref.rounding_err,
                  kLseTolerance);
    }
  }

  // Three passes: every row run once and checked; the rows that ran, timed
  // together, their iterations interleaved (time_calls_interleaved), so that
  // peers and rungs meet the same clocks; then each row's figures, in order.
  std::vector<Row> rows;
  for (const Variant* v : selected) {
    if (result.device_lost) break;
    Row r;
    r.variant = v;
    if (std::string why = v->unsupported_reason(p); !why.empty()) {
      r.status = "unsupported";
      r.note = why;
    } else {
      r.outcome = run_and_check(*v, p, bufs, opt.check ? &ref : nullptr, stream);
      if (!r.outcome.error.empty()) result.device_lost = cudaDeviceSynchronize() != cudaSuccess;  // sticky errors end the run
    }
    rows.push_back(r);
  }
  std::vector<std::function<std::string()>> calls;
  std::vector<size_t> timed;  // the rows behind calls
  for (size_t i = 0; i < rows.size() && !result.device_lost; ++i)
    if (rows[i].status.empty() && rows[i].outcome.error.empty()) {
      calls.push_back(variant_call(*rows[i].variant, p, bufs, stream));
      timed.push_back(i);
    }
  std::vector<Timing> timings;
  std::vector<std::string> errors;
  time_calls_interleaved(calls, opt.warmup, opt.iters, bufs.flush, bufs.flush_bytes, stream, &timings, &errors);
  for (size_t c = 0; c < timed.size(); ++c) {
    rows[timed[c]].timing = timings[c];
    rows[timed[c]].outcome.error = errors[c];
  }
  if (!timed.empty()) result.device_lost = result.device_lost || cudaDeviceSynchronize() != cudaSuccess;

  double best = 0;
  int hidden = 0;
  for (Row& r : rows) {
    const Variant* v = r.variant;
    if (r.status.empty()) {
      if (!r.outcome.error.empty() || !r.ran()) {
        r.status = "error";
        r.note = r.outcome.error.empty() ? "not timed (the device failed)" : r.outcome.error;
        r.timing = Timing{};
        result.failures += v->is_peer ? 0 : 1;  // a peer that cannot run is reported, not failed
      } else {
        r.tflops = forward_flops(p) / (r.timing.median_ms * 1e-3) / 1e12;
        if (r.tflops > best) {
          r.gain_pct = best > 0 ? (r.tflops / best - 1.0) * 100.0 : 0.0;
          best = r.tflops;
        }
        if (r.outcome.checked && v == &unfused) {
          // The yardstick of the check rule is not judged by it: its S is stored
          // in 16 bits, so its LSE is only as good as those scores.
          char note[96];
          std::snprintf(note, sizeof note, "baseline err %.2e, lse %.2e", r.outcome.check.err,
                        r.outcome.check.lse_err);
          r.status = "baseline";
          r.note = note;
        } else if (r.outcome.checked) {
          r.status = r.outcome.check.pass ? "PASS" : "FAIL";
          r.note = r.outcome.check.summary();
          result.failures += (r.outcome.check.pass || v->is_peer) ? 0 : 1;
        } else {
          r.status = "unchecked";
        }
        // Peers come first, so the best peer is known when a rung's row is made.
        const bool peer_trusted = r.status != "FAIL";
        if (v->is_peer && peer_trusted && r.tflops > result.best_peer_tflops) {
          result.best_peer_tflops = r.tflops;
          result.best_peer_name = v->name;
        }
        if (!v->is_peer && result.best_peer_tflops > 0) r.ratio_to_best_peer = r.tflops / result.best_peer_tflops;
      }
    }
    const bool interesting = r.status == "FAIL" || r.status == "error" || r.status == "unsupported" || r.gain_pct >= 0;
    if (verbose && (opt.show_all || interesting)) print_row(r, result.best_peer_name);
    else if (verbose) ++hidden;
  }
  result.rows = std::move(rows);
  if (verbose) {
    std::printf("%s\n", std::string(kTableWidth, '-').c_str());
    if (hidden > 0)
      std::printf("(%d row%s hidden: slower than the best so far; --show-all shows them)\n", hidden,
                  hidden > 1 ? "s" : "");
  }
  return result;
}

// One line per shape for --sweep.
void print_sweep_line(int index, int total, const AttnProblem& p, const ShapeResult& r, double seconds) {
  const Row* best_rung = nullptr;
  for (const Row& row : r.rows)
    if (!row.variant->is_peer && row.ran() && (!best_rung || row.tflops > best_rung->tflops)) best_rung = &row;
  char rung[96] = "no rung runs this shape", peer[96] = "no peer";
  if (best_rung) std::snprintf(rung, sizeof rung, "%s %.1f", best_rung->variant->name.c_str(), best_rung->tflops);
  if (r.best_peer_tflops > 0) std::snprintf(peer, sizeof peer, "%s %.1f", r.best_peer_name.c_str(), r.best_peer_tflops);
  char ratio[32] = "";
  if (best_rung && r.best_peer_tflops > 0) std::snprintf(ratio, sizeof ratio, " (%.2fx)", best_rung->tflops / r.best_peer_tflops);
  std::printf("[%3d/%d] N=%-6d D=%-5d %-7s  best rung: %-28s best peer: %-24s%s  %.1fs%s%s\n", index, total, p.Nq,
              p.D, p.causal ? "causal" : "dense", rung, peer, ratio, seconds, r.failures ? "  FAILURES" : "",
              r.fatal.empty() ? "" : ("  skipped: " + r.fatal).c_str());
  std::fflush(stdout);
}

// --list: one line per row, the columns padded to their longest entry.
void print_list(const std::vector<const Variant*>& rows) {
  size_t name_width = 0, rung_width = 0;
  for (const Variant* v : rows) {
    name_width = std::max(name_width, v->name.size());
    rung_width = std::max(rung_width, v->rung.size());
  }
  for (const Variant* v : rows)
    std::printf("%-*s  %-*s  %s\n", int(name_width), v->name.c_str(), int(rung_width), v->rung.c_str(),
                v->describe().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // Everything the options alone can show is checked first (exit 2), then the
  // GPU (exit 3); only then does anything run.
  const ParseResult parsed = parse_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) return fail(parsed.error, kExitBadOptions);
  const Options& opt = parsed.options;
  if (opt.help) {
    std::fputs(usage().c_str(), stdout);
    return kExitOk;
  }
  const bool sdpa_asked = opt.sdpa && opt.peers_given;  // by default: the SDPA rows where the build has them
  if ((sdpa_asked || opt.torch_reference) && !have_torch())
    return fail(std::string(sdpa_asked ? "--sdpa" : "--reference torch") +
                    " needs PyTorch, and this build has none (reconfigure where `python3 -c 'import torch'` works)",
                kExitBadOptions);

  // Rows: the peers first (every group this build has, or those --torch and
  // --sdpa pick; none with --no-peers), then the ladder in order. Without
  // torch, the torch peer lists are empty.
  const Variant& unfused = unfused_baseline();
  static const std::vector<Variant> torch_unfused = make_torch_unfused_peers(), sdpa = make_sdpa_peers();
  std::vector<const Variant*> selected;
  if (opt.torch) {
    selected.push_back(&unfused);
    for (const Variant& v : torch_unfused) selected.push_back(&v);
  }
  if (opt.sdpa)
    for (const Variant& v : sdpa) selected.push_back(&v);
  const size_t n_peers = selected.size();
  for (const Variant& v : all_variants())
    if (glob_match(opt.variant_glob, v.name)) selected.push_back(&v);

  if (opt.list) {
    print_list(selected);
    return kExitOk;
  }
  if (selected.size() == n_peers)
    return fail("no variant matches --variant '" + opt.variant_glob + "' (see --list)", kExitBadOptions);
  if (!opt.csv.empty())
    if (std::string e = results_csv_error(opt.csv); !e.empty()) return fail(e, kExitBadOptions);

  int device_count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&device_count); e != cudaSuccess)
    return fail("no usable CUDA GPU: " + cuda_error_text("cudaGetDeviceCount", e), kExitNoGpu);
  if (device_count == 0) return fail("no usable CUDA GPU: cudaGetDeviceCount found 0 devices", kExitNoGpu);
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreate(&stream); e != cudaSuccess)
    return fail("no usable CUDA GPU: " + cuda_error_text("cudaStreamCreate", e), kExitNoGpu);
  const SystemInfo sys = collect_system_info();
  const uint64_t seed =
      opt.seed_given ? opt.seed
                     : uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007ull;

  if (opt.dynamic_mask()) return run_dynamic_mask_mode(opt, sys, seed, stream);

  // One shape, or the sweep's grid.
  std::vector<AttnProblem> problems;
  if (opt.sweep) {
    for (int causal : opt.sweep_causal)
      for (int D : opt.sweep_D)
        for (int N : opt.sweep_N) {
          Options o = opt;
          o.Nq = o.Nk = N;
          o.D = o.Dv = D;
          o.causal = causal != 0;
          problems.push_back(to_problem(o));
        }
    std::printf("sweep: %zu shapes, B=%d H=%d, %s, %d warmup + %d timed runs each, seed %llu\n", problems.size(), opt.B,
                opt.H, dtype_name(opt.dtype), opt.warmup, opt.iters, static_cast<unsigned long long>(seed));
  } else {
    problems.push_back(to_problem(opt));
  }

  int failures = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const ShapeResult r = run_shape(opt, problems[i], selected, seed + i, stream, !opt.sweep);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r.fatal.empty() && !opt.sweep) return fail(r.fatal, kExitFailed);
    if (opt.sweep) print_sweep_line(int(i + 1), int(problems.size()), problems[i], r, seconds);
    if (!opt.csv.empty() && r.fatal.empty())
      if (std::string e = append_csv(opt.csv, sys, problems[i], seed + i, r.rows); !e.empty())
        return fail(e, kExitFailed);
    failures += r.failures;
    if (r.device_lost) return fail("the GPU reported a fatal error; later rows were not run", kExitFailed);
  }
  std::printf("%s | driver %s | CUDA %s | torch %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(),
              sys.cuda.c_str(), torch_version().c_str(), sys.commit.c_str(), sys.date.c_str());
  if (failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", failures, failures > 1 ? "s" : "");
    return kExitFailed;
  }
  return kExitOk;
}
