// flash_attn_mma's dense backward (--bwd without --mask or --mask-mod): one
// shape, the gradients of L = Σ O ⊙ dO. Rows (a peer's printed as "<name> bwd"):
//   sdpa(flash), sdpa(cudnn), sdpa(efficient), torch(unfused)
//                 torch's autograd on the same Q, K, V, dO without a mask, each
//                 from its own forward graph, the backward alone timed
//                 (bench/torch_peers.h; in a torch build, unless --no-peers)
//   bwd-mma, bwd-ws, ...   every rung of all_bwd_variants() that --variant picks
//                 (--deterministic: those whose dQ sums in a fixed order alone)
// The forward every row starts from: the fp32 reference's O rounded to the
// input dtype and its LSE (so that no rung's forward error reaches the
// backward's check), dO standard normal. Each of dQ, dK, dV is judged alone by
// the forward's rule against the fp32 reference backward, the yardstick the
// same-precision unfused backward (reference.h); a deterministic rung must
// also repeat its gradients bit for bit. TFLOPS: backward_flops(p) / median
// time, timed as the forward is (interleaved, L2 flushed: bench/table.h).
#include "bwd_mode.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "runner.h"
#include "table.h"
#include "torch_peers.h"

namespace attnlab {

std::vector<const BwdVariant*> backward_rows(const CommonOptions& opt, const DenseOptions& dense, size_t* rungs) {
  static const std::vector<BwdVariant> torch_unfused = make_torch_unfused_backward_peers(),
                                       sdpa = make_sdpa_backward_peers();
  std::vector<const BwdVariant*> rows;
  if (opt.sdpa)
    for (const BwdVariant& v : sdpa) rows.push_back(&v);
  if (opt.torch)
    for (const BwdVariant& v : torch_unfused) rows.push_back(&v);
  const size_t peers = rows.size();
  for (const BwdVariant& v : all_bwd_variants())
    if (variant_selected(dense.variant_glob, v) && (v.deterministic || !opt.deterministic)) rows.push_back(&v);
  *rungs = rows.size() - peers;
  return rows;
}

namespace {

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", message.c_str());
  return code;
}

// "dQ 1.2e-03, dK 3.4e-04, dV 5.6e-04" of one figure per gradient ("unavailable" where < 0).
std::string per_gradient(const double (&x)[kGrads]) {
  std::string s;
  for (int g = 0; g < kGrads; ++g) {
    char buf[48];
    if (x[g] >= 0) std::snprintf(buf, sizeof buf, "%s%s %.2e", g ? ", " : "", kGradNames[g], x[g]);
    else std::snprintf(buf, sizeof buf, "%s%s unavailable", g ? ", " : "", kGradNames[g]);
    s += buf;
  }
  return s;
}

}  // namespace

// One row run once (into poisoned gradients) and, unless --no-check, checked;
// a deterministic rung then repeated and compared bit for bit.
TableRow backward_row(const CommonOptions& opt, const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs,
                      const GradReference& ref, cudaStream_t stream) {
  TableRow r;
  r.name = v.is_peer ? v.name + " bwd" : v.name;  // the rungs' names say it already ("bwd-ws")
  r.is_peer = v.is_peer;
  if (std::string why = v.unsupported_reason(p); !why.empty()) {
    r.status = "unsupported";
    r.note = why;
    return r;
  }
  const BwdRunOutcome out = run_and_check_backward(v, p, bufs, opt.check ? &ref : nullptr, stream);
  r.error = out.error;
  std::copy(out.first_values, out.first_values + 3, r.first_values);
  if (!out.error.empty() || !out.checked) return r;
  r.checked = true;
  r.pass = out.check.pass;
  const int worst = out.check.worst();  // the CSV's err and tol: the gradient nearest its bound
  r.err = out.check.grad[worst].err;
  r.tol = out.check.grad[worst].tol;
  r.check_note = out.check.summary();
  if (v.deterministic) {
    bool identical = false;
    r.error = check_bitwise_repeatable(v, p, bufs, kDeterminismRuns, stream, &identical);
    const std::string runs = std::to_string(1 + kDeterminismRuns) + " runs";
    r.check_note += identical ? "; bitwise identical over " + runs : "; NOT bitwise identical over " + runs;
    r.pass = r.pass && identical;
    if (!identical && r.check_note.rfind("PASS", 0) == 0) r.check_note.replace(0, 4, "FAIL");
  }
  return r;
}

int run_dense_backward_mode(const CommonOptions& opt, const DenseOptions& dense,
                            const std::vector<const BwdVariant*>& selected, const SystemInfo& sys, uint64_t seed,
                            cudaStream_t stream) {
  const AttnProblem p = to_problem(opt);
  size_t wanted = 0;  // the workspace: the most a row that runs this shape asks for
  for (const BwdVariant* v : selected)
    if (v->unsupported_reason(p).empty()) wanted = std::max(wanted, v->workspace_bytes(p));
  GradBuffers bufs;
  if (std::string e = bufs.allocate(p, opt.check, wanted); !e.empty()) return fail(e, kExitFailed);
  GradReference ref;
  if (std::string e = prepare_backward_inputs(p, bufs, seed, opt.check, stream, &ref); !e.empty())
    return fail(e, kExitFailed);

  char banner[256];
  std::snprintf(banner, sizeof banner, " backward: %s, Warmup: %d, Iters: %d, Seed: %llu ", p.shape_string().c_str(),
                opt.warmup, opt.iters, static_cast<unsigned long long>(seed));
  print_banner(banner);
  std::printf("%32s  O and LSE of the fp32 reference forward (O rounded to %s), dO random; no mask%s\n", "forward",
              dtype_name(p.dtype), p.causal ? " (causal)" : "");
  if (opt.check)
    std::printf("%32s  vs the fp32 reference backward; pass, each of dQ, dK, dV: err <= 2 x same-precision unfused "
                "err (%s) + 2 x rounding (%s)\n",
                "check", per_gradient(ref.baseline_err).c_str(), per_gradient(ref.rounding_err).c_str());
  size_t rungs = 0;
  for (const BwdVariant* v : selected) rungs += v->is_peer ? 0 : 1;
  if (rungs == 0) std::printf("%32s  (no backward rung matches --variant '%s')\n", "", dense.variant_glob.c_str());

  // As the forward: every row run once and checked, then the rows that ran
  // timed together, their iterations interleaved, then each row's figures.
  std::vector<TableRow> rows;
  std::vector<std::function<std::string()>> calls;
  bool device_lost = false;
  for (const BwdVariant* v : selected) {
    TableRow r = backward_row(opt, *v, p, bufs, ref, stream);
    if (!r.error.empty()) device_lost = cudaDeviceSynchronize() != cudaSuccess;  // sticky errors end the run
    calls.push_back(r.status.empty() && r.error.empty() ? variant_call(*v, p, bufs.grad(), stream)
                                                        : std::function<std::string()>());
    rows.push_back(r);
    if (device_lost) break;
  }
  if (!device_lost) device_lost = time_rows(rows, calls, opt.warmup, opt.iters, bufs.fwd.flush,
                                            bufs.fwd.flush_bytes, stream);
  const TableScore score = score_rows(rows, backward_flops(p));
  print_table(rows, score.best_peer_name, dense.show_all);
  std::printf("%s | driver %s | CUDA %s | torch %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(),
              sys.cuda.c_str(), torch_version().c_str(), sys.commit.c_str(), sys.date.c_str());
  if (!opt.csv.empty())
    if (std::string e = append_rows_csv(opt.csv, sys, p, seed, rows); !e.empty()) return fail(e, kExitFailed);
  if (device_lost) return fail("the GPU reported a fatal error; later rows were not run", kExitFailed);
  if (score.failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", score.failures, score.failures > 1 ? "s" : "");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace attnlab
