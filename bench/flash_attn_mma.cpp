// flash_attn_mma — every attention variant of attnlab on one shape, timed and
// checked side by side. See README.md for the columns and the FLOP convention.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli.h"
#include "runner.h"
#include "system_info.h"

using namespace attnlab;

namespace {

struct Row {
  std::string name;
  std::string status;  // PASS, FAIL, baseline, unchecked, unsupported, error
  std::string note;    // check summary, the unsupported reason or the error
  RunOutcome outcome;
  Timing timing;
  double tflops = 0;
  double gain_pct = -1;  // over the best row so far; < 0 when not an improvement
};

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", message.c_str());
  return code;
}

std::string csv_field(std::string s) {
  for (char& c : s)
    if (c == ',' || c == '\n' || c == '"') c = ';';
  return s;
}

void append_csv(const std::string& path, const SystemInfo& sys, const AttnProblem& p, uint64_t seed,
                const std::vector<Row>& rows) {
  std::ifstream probe(path);
  const bool need_header = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
  probe.close();
  std::ofstream f(path, std::ios::app);
  if (need_header)
    f << "gpu,driver,cuda,commit,date,variant,B,H,Nq,Nk,D,Dv,dtype,causal,time_ms,tflops,status,max_err,tol,lse_err,"
         "seed,note\n";
  for (const Row& r : rows) {
    char nums[160] = "";
    if (r.timing.median_ms > 0) std::snprintf(nums, sizeof nums, "%.6f,%.2f", r.timing.median_ms, r.tflops);
    else std::snprintf(nums, sizeof nums, ",");
    char errs[96] = ",,";
    if (r.outcome.checked)
      std::snprintf(errs, sizeof errs, "%.3e,%.3e,%.3e", r.outcome.check.err, r.outcome.check.tol,
                    r.outcome.check.lse_err);
    f << csv_field(sys.gpu) << ',' << csv_field(sys.driver) << ',' << csv_field(sys.cuda) << ',' << sys.commit << ','
      << sys.date << ',' << r.name << ',' << p.B << ',' << p.H << ',' << p.Nq << ',' << p.Nk << ',' << p.D << ','
      << p.Dv << ',' << dtype_name(p.dtype) << ',' << (p.causal ? 1 : 0) << ',' << nums << ',' << r.status << ','
      << errs << ',' << seed << ',' << csv_field(r.note) << '\n';
  }
}

void print_row(const Row& r) {
  if (r.status == "unsupported" || r.status == "error") {
    std::printf("%32s: %s: %s\n", r.name.c_str(), r.status.c_str(), r.note.c_str());
    return;
  }
  const float* v = r.outcome.first_values;
  char gain[32] = "";
  if (r.gain_pct >= 0) std::snprintf(gain, sizeof gain, "(+%.2f%%)", r.gain_pct);
  std::printf("%32s: ['%-11.8f', '%-11.8f', '%-11.8f'], time:%.6fms, TFLOPS:%-7.2f%-10s", r.name.c_str(), v[0], v[1],
              v[2], r.timing.median_ms, r.tflops, gain);
  if (r.outcome.checked) std::printf(" %s", r.note.c_str());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const ParseResult parsed = parse_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) return fail(parsed.error, 2);
  const Options& opt = parsed.options;
  if (opt.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  if (opt.list) {
    for (const Variant& v : all_variants()) std::printf("%-28s %-14s %s\n", v.name.c_str(), v.rung.c_str(), v.describe().c_str());
    return 0;
  }

  // Rows: the unfused baseline first (with --torch), then the ladder in order.
  static const Variant unfused = make_unfused_baseline();
  std::vector<const Variant*> selected;
  if (opt.torch) selected.push_back(&unfused);
  for (const Variant& v : all_variants())
    if (glob_match(opt.variant_glob, v.name)) selected.push_back(&v);
  if (selected.empty()) return fail("no variant matches --variant '" + opt.variant_glob + "' (see --list)", 2);

  int device_count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&device_count); e != cudaSuccess || device_count == 0)
    return fail(std::string("no CUDA GPU found (") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")",
                1);

  const AttnProblem p = to_problem(opt);
  const uint64_t seed =
      opt.seed_given ? opt.seed
                     : uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007ull;

  // Workspace: the unfused baseline needs S, for all heads ideally, one at least.
  const size_t s_per_head = size_t(p.Nq) * size_t(p.Nk) * kInputElementBytes;
  const bool unfused_runs = (opt.torch || opt.check) && unfused.unsupported_reason(p).empty();
  size_t wanted = 0;
  for (const Variant* v : selected)
    if (v != &unfused && v->unsupported_reason(p).empty()) wanted = std::max(wanted, v->workspace_bytes(p));
  if (unfused_runs) wanted = std::max(wanted, unfused.workspace_bytes(p));
  ProblemBuffers bufs;
  if (std::string e = bufs.allocate(p, opt.check, wanted, unfused_runs ? s_per_head : 0, unfused_runs ? s_per_head : 0);
      !e.empty())
    return fail(e, 1);

  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreate(&stream); e != cudaSuccess) return fail(cuda_error_text("cudaStreamCreate", e), 1);
  ReferenceData ref;
  if (std::string e = prepare_inputs(p, bufs, seed, opt.check, stream, &ref); !e.empty()) return fail(e, 1);

  const SystemInfo sys = collect_system_info();
  char banner[256];
  std::snprintf(banner, sizeof banner, " %s, Warmup: %d, Iters: %d, Seed: %llu ", p.shape_string().c_str(), opt.warmup,
                opt.iters, static_cast<unsigned long long>(seed));
  const int width = 140, pad = std::max(0, width - int(std::string(banner).size())) / 2;
  const std::string rule_l(size_t(pad), '-'), rule_r(size_t(std::max(0, width - pad - int(std::string(banner).size()))), '-');
  std::printf("%s%s%s\n", rule_l.c_str(), banner, rule_r.c_str());
  if (opt.check) {
    char baseline[32] = "unavailable";
    if (ref.baseline_err >= 0) std::snprintf(baseline, sizeof baseline, "%.2e", ref.baseline_err);
    std::printf("%32s  vs fp32 reference; pass: err <= 2 x unfused err (%s) + 2 x rounding (%.2e), lse <= %.0e\n",
                "check", baseline, ref.rounding_err, kLseTolerance);
  }

  std::vector<Row> rows;
  double best = 0;
  int failures = 0, hidden = 0;
  bool device_lost = false;
  for (const Variant* v : selected) {
    Row r;
    r.name = v->name;
    if (device_lost) break;
    if (std::string why = v->unsupported_reason(p); !why.empty()) {
      r.status = "unsupported";
      r.note = why;
    } else {
      r.outcome = run_and_check(*v, p, bufs, opt.check ? &ref : nullptr, stream);
      if (r.outcome.error.empty()) r.outcome.error = time_variant(*v, p, bufs, opt.warmup, opt.iters, stream, &r.timing);
      if (!r.outcome.error.empty()) {
        r.status = "error";
        r.note = r.outcome.error;
        ++failures;
        device_lost = cudaDeviceSynchronize() != cudaSuccess;  // sticky errors end the run
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
          std::snprintf(note, sizeof note, "baseline err %.2e, lse %.2e", r.outcome.check.err, r.outcome.check.lse_err);
          r.status = "baseline";
          r.note = note;
        } else if (r.outcome.checked) {
          r.status = r.outcome.check.pass ? "PASS" : "FAIL";
          r.note = r.outcome.check.summary();
          failures += r.outcome.check.pass ? 0 : 1;
        } else {
          r.status = "unchecked";
        }
      }
    }
    const bool interesting = r.status == "FAIL" || r.status == "error" || r.status == "unsupported" || r.gain_pct >= 0;
    if (opt.show_all || interesting) print_row(r);
    else ++hidden;
    rows.push_back(r);
  }
  std::printf("%s\n", std::string(width, '-').c_str());
  if (hidden > 0) std::printf("(%d row%s hidden: slower than the best so far; --show-all shows them)\n", hidden, hidden > 1 ? "s" : "");
  std::printf("%s | driver %s | CUDA %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(), sys.cuda.c_str(),
              sys.commit.c_str(), sys.date.c_str());
  if (!opt.csv.empty()) append_csv(opt.csv, sys, p, seed, rows);
  if (device_lost) return fail("the GPU reported a fatal error; later rows were not run", 1);
  if (failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", failures, failures > 1 ? "s" : "");
    return 1;
  }
  return 0;
}
