// flash_attn_mma — every attention variant of attnlab on one shape, timed and
// checked side by side with the peers. See README.md for the columns and the
// FLOP convention.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "blocksparse_mode.h"
#include "bwd_mode.h"
#include "cli.h"
#include "decode_mode.h"
#include "dmattn_mode.h"
#include "runner.h"
#include "system_info.h"
#include "table.h"
#include "torch_peers.h"
#include "varlen_mode.h"

using namespace attnlab;

namespace {

struct ShapeResult {
  std::vector<TableRow> rows;
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

// The unfused baseline: one object, so that run_shape knows its row (the
// yardstick of the check rule, reported as "baseline", not judged by itself).
const Variant& unfused_baseline() {
  static const Variant unfused = make_unfused_baseline();
  return unfused;
}

// --reference torch: O_ref and LSE_ref from torch's fp32 math SDPA (torch_peers.h).
ForwardReference torch_forward_reference() {
  return [](const AttnProblem& p, const AttnBuffers& in, float* o_ref, float* lse_ref, cudaStream_t stream) {
    const std::string e = torch_reference(p, in.q, in.k, in.v, o_ref, lse_ref, stream);
    return e.empty() ? e : "torch reference: " + e;
  };
}

// Runs every selected row on one problem. `verbose` prints the table of rows.
ShapeResult run_shape(const CommonOptions& opt, const DenseOptions& dense, const AttnProblem& p,
                      const std::vector<const Variant*>& selected, uint64_t seed, cudaStream_t stream, bool verbose) {
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
  result.fatal = prepare_inputs(p, bufs, seed, opt.check, stream, &ref,
                                dense.torch_reference ? torch_forward_reference() : nullptr);
  if (!result.fatal.empty()) return result;

  if (verbose) {
    char banner[256];
    std::snprintf(banner, sizeof banner, " %s, Warmup: %d, Iters: %d, Seed: %llu ", p.shape_string().c_str(),
                  opt.warmup, opt.iters, static_cast<unsigned long long>(seed));
    print_banner(banner);
    if (opt.check) {
      char baseline[32] = "unavailable";
      if (ref.baseline_err >= 0) std::snprintf(baseline, sizeof baseline, "%.2e", ref.baseline_err);
      std::printf("%32s  vs %s; pass: err <= 2 x unfused err (%s) + 2 x rounding (%.2e), lse <= %.0e (unfused: + its S rounding)\n", "check",
                  dense.torch_reference ? "torch fp32 math SDPA" : "fp32 reference", baseline, ref.rounding_err,
                  kLseTolerance);
    }
  }

  // Three passes: every row run once and checked; the rows that ran, timed
  // together, their iterations interleaved (time_rows), so that peers and
  // rungs meet the same clocks; then each row's figures, in order.
  std::vector<TableRow> rows;
  std::vector<std::function<std::string()>> calls;
  for (const Variant* v : selected) {
    if (result.device_lost) break;
    TableRow r;
    r.name = v->name;
    r.is_peer = v->is_peer;
    r.is_baseline = v == &unfused;
    if (std::string why = v->unsupported_reason(p); !why.empty()) {
      r.status = "unsupported";
      r.note = why;
    } else {
      const RunOutcome out = run_and_check(*v, p, bufs, opt.check ? &ref : nullptr, stream);
      set_outcome(r, out);
      if (out.checked && r.is_baseline) {
        // The yardstick of the check rule is not judged by it: its S is stored
        // in 16 bits, so its LSE is only as good as those scores.
        char note[96];
        std::snprintf(note, sizeof note, "baseline err %.2e, lse %.2e", out.check.err, out.check.lse_err);
        r.check_note = note;
      }
      if (!r.error.empty()) result.device_lost = cudaDeviceSynchronize() != cudaSuccess;  // sticky errors end the run
    }
    calls.push_back(r.status.empty() && r.error.empty() ? variant_call(*v, p, bufs.attn(), stream)
                                                        : std::function<std::string()>());
    rows.push_back(r);
  }
  if (!result.device_lost)
    result.device_lost = time_rows(rows, calls, opt.warmup, opt.iters, bufs.flush, bufs.flush_bytes, stream);
  const TableScore score = score_rows(rows, forward_flops(p));
  result.best_peer_name = score.best_peer_name;
  result.best_peer_tflops = score.best_peer_tflops;
  result.failures = score.failures;
  if (verbose) print_table(rows, result.best_peer_name, dense.show_all);
  result.rows = std::move(rows);
  return result;
}

// One line per shape for --sweep.
void print_sweep_line(int index, int total, const AttnProblem& p, const ShapeResult& r, double seconds) {
  const TableRow* best_rung = nullptr;
  for (const TableRow& row : r.rows)
    if (!row.is_peer && row.ran() && (!best_rung || row.tflops > best_rung->tflops)) best_rung = &row;
  char rung[96] = "no rung runs this shape", peer[96] = "no peer";
  if (best_rung) std::snprintf(rung, sizeof rung, "%s %.1f", best_rung->name.c_str(), best_rung->tflops);
  if (r.best_peer_tflops > 0) std::snprintf(peer, sizeof peer, "%s %.1f", r.best_peer_name.c_str(), r.best_peer_tflops);
  char ratio[32] = "";
  if (best_rung && r.best_peer_tflops > 0) std::snprintf(ratio, sizeof ratio, " (%.2fx)", best_rung->tflops / r.best_peer_tflops);
  std::printf("[%3d/%d] N=%-6d D=%-5d %-7s  best rung: %-28s best peer: %-24s%s  %.1fs%s%s\n", index, total, p.Nq,
              p.D, p.causal ? "causal" : "dense", rung, peer, ratio, seconds, r.failures ? "  FAILURES" : "",
              r.fatal.empty() ? "" : ("  skipped: " + r.fatal).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  // Everything the options alone can show is checked first (exit 2), then the
  // GPU (exit 3); only then does anything run.
  const ParseResult parsed = parse_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) return fail(parsed.error, kExitBadOptions);
  const Options& options = parsed.options;
  const CommonOptions& opt = options.common;
  const DenseOptions& dense = options.dense;
  const Program program = options.program;
  if (opt.help) {
    std::fputs(usage().c_str(), stdout);
    return kExitOk;
  }
  const bool sdpa_asked = opt.sdpa && opt.peers_given;  // by default: the SDPA rows where the build has them
  if ((sdpa_asked || dense.torch_reference) && !have_torch())
    return fail(std::string(sdpa_asked ? "--sdpa" : "--reference torch") +
                    " needs PyTorch, and this build has none (reconfigure where `python3 -c 'import torch'` works)",
                kExitBadOptions);

  // --mask-mod: the block-sparse mode (bench/blocksparse_mode.cpp), its own rows.
  if (program == Program::kBlocksparse && opt.list) {
    print_list(blocksparse_list(opt));
    return kExitOk;
  }
  // --varlen: the variable-length mode (bench/varlen_mode.cpp), its own rows.
  if (program == Program::kVarlen && opt.list) {
    print_list(varlen_list());
    return kExitOk;
  }
  // --decode: the paged-decoding mode (bench/decode_mode.cpp), its own rows.
  if (program == Program::kDecode && opt.list) {
    print_list(decode_list());
    return kExitOk;
  }

  // --bwd alone: the dense backward (bench/bwd_mode.cpp), its own rows.
  std::vector<const BwdVariant*> bwd_rows;
  if (program == Program::kDenseBackward) {
    size_t rungs = 0;
    bwd_rows = backward_rows(opt, dense, &rungs);
    if (opt.list) {
      std::vector<ListEntry> entries;
      for (const BwdVariant* v : bwd_rows) entries.push_back({v->name + " bwd", v->rung, v->describe()});
      print_list(entries);
      return kExitOk;
    }
    if (rungs == 0 && dense.variant_glob != "*")
      return fail(std::string(opt.deterministic ? "no deterministic" : "no") + " backward variant matches --variant '" +
                      dense.variant_glob + "' (see --list --bwd" + (opt.deterministic ? " --deterministic)" : ")"),
                  kExitBadOptions);
  }

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
    if (variant_selected(dense.variant_glob, v)) selected.push_back(&v);

  if (opt.list) {
    std::vector<ListEntry> entries;
    for (const Variant* v : selected) entries.push_back({v->name, v->rung, v->describe()});
    print_list(entries);
    return kExitOk;
  }
  if (selected.size() == n_peers && program != Program::kDenseBackward)
    return fail("no variant matches --variant '" + dense.variant_glob + "' (see --list)", kExitBadOptions);
  if (program == Program::kBlocksparse)
    if (std::string e = blocksparse_options_unsupported(opt, options.blocksparse); !e.empty())
      return fail(e, kExitBadOptions);
  if (program == Program::kVarlen)
    if (std::string e = varlen_options_unsupported(options.varlen); !e.empty()) return fail(e, kExitBadOptions);
  if (program == Program::kDecode)
    if (std::string e = decode_options_unsupported(options.decode); !e.empty()) return fail(e, kExitBadOptions);
  if (!opt.csv.empty()) {
    const char* extra_columns = program == Program::kBlocksparse ? kBlocksparseCsvColumns
                                : program == Program::kVarlen    ? kVarlenCsvColumns
                                : program == Program::kDecode    ? kDecodeCsvColumns
                                                                 : "";
    if (std::string e = results_csv_error(opt.csv, extra_columns); !e.empty()) return fail(e, kExitBadOptions);
  }

  int device_count = 0, driver_version = 0, runtime_version = 0;
  cudaDriverGetVersion(&driver_version);  // 0 without a driver
  cudaRuntimeGetVersion(&runtime_version);
  if (cudaError_t e = cudaGetDeviceCount(&device_count); e != cudaSuccess || device_count == 0)
    return fail(no_gpu_text("cudaGetDeviceCount", e, driver_version, runtime_version), kExitNoGpu);
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreate(&stream); e != cudaSuccess)
    return fail(no_gpu_text("cudaStreamCreate", e, driver_version, runtime_version), kExitNoGpu);
  const SystemInfo sys = collect_system_info();
  const uint64_t seed =
      opt.seed_given ? opt.seed
                     : uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007ull;

  switch (program) {
    case Program::kBlocksparse: return run_blocksparse_mode(opt, options.blocksparse, sys, seed, stream);
    case Program::kVarlen: return run_varlen_mode(opt, options.varlen, sys, seed, stream);
    case Program::kDecode: return run_decode_mode(opt, options.decode, sys, seed, stream);
    case Program::kDynamicMask: return run_dynamic_mask_mode(opt, options.dynamic_mask, sys, seed, stream);
    case Program::kDenseBackward: return run_dense_backward_mode(opt, dense, bwd_rows, sys, seed, stream);
    case Program::kDenseForward: break;
  }

  // One shape, or the sweep's grid.
  std::vector<AttnProblem> problems;
  if (dense.sweep) {
    for (int causal : dense.sweep_causal)
      for (int D : dense.sweep_D)
        for (int N : dense.sweep_N) {
          CommonOptions o = opt;
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
    const ShapeResult r = run_shape(opt, dense, problems[i], selected, seed + i, stream, !dense.sweep);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r.fatal.empty() && !dense.sweep) return fail(r.fatal, kExitFailed);
    if (dense.sweep) print_sweep_line(int(i + 1), int(problems.size()), problems[i], r, seconds);
    if (!opt.csv.empty() && r.fatal.empty())
      if (std::string e = append_rows_csv(opt.csv, sys, problems[i], seed + i, r.rows); !e.empty())
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
