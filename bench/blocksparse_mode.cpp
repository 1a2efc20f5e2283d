// flash_attn_mma's block-sparse mode (--mask-mod, --score-mod, --block-size):
// FlexAttention's forward, or with --bwd its backward, on one shape. Rows, as
// the dense table's (bench/table.h: run once and checked, then timed together,
// interleaved):
//   sdpa(cudnn), sdpa(flash)   torch's SDPA where it can say the same mask: the
//                              mask_mod causal or none and no score_mod (in a
//                              torch build, unless --no-peers); causal by torch's
//                              is_causal, so unsupported when Nq != Nk
//   blocksparse                ours: blocksparse_fwd on the block mask that
//                              build_block_mask_from_mod built on the GPU
// --bwd: the same peers' backward ("sdpa(cudnn) bwd"), and ours,
//   blocksparse bwd            blocksparse_bwd on the same block mask
//   blocksparse-det bwd        its deterministic mode (also repeated bit for bit;
//                              --deterministic: this row of ours alone)
// from O and LSE of the fp32 mods reference forward (O rounded to the dtype)
// and a random dO, each of dQ, dK, dV checked against the fp32 mods reference
// backward (mods_reference.h) by the dense backward's rule.
// torch's compiled flex_attention is not a row: torch compiles it from Python
// (torch.compile), so it runs in scripts/bench_blocksparse.py, beside
// attnlab.flex_attention on the same block mask.
// The check (unless --no-check): O and LSE against mods_attention_fp32
// (kernels/reference/mods_reference.h), the fp32 reference that applies the
// mods pair by pair, by the project's rule, the yardstick its same-precision
// path (P rounded to the dtype before P·V). TFLOPS: 2·(D+Dv)·pairs / time
// (backward: 2·(3D+2Dv)·pairs) for every row, pairs = the (b, h, q, k) the mask_mod keeps, counted exactly on
// the GPU (count_kept_pairs), not the pairs of the blocks the kernel visits
// (the banner gives both).
//
// run_blocksparse_mode, at the bottom, reads as the run does: set_up (the
// problem, the block mask, the pair count, then the inputs and references of
// the forward or of the backward), the rows, the report.
#include "blocksparse_mode.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <utility>

#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/blocksparse_bwd.h"
#include "blocksparse/blocksparse_fwd.h"
#include "blocksparse/mods.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"
#include "bwd_mode.h"
#include "runner.h"
#include "torch_peers.h"

namespace attnlab {
namespace {

// The SDPA peers this mode runs, cuDNN's then flash's, of make_sdpa_peers
// (forward) or make_sdpa_backward_peers (--bwd).
template <typename V>
std::vector<const V*> pick_sdpa_peers(const std::vector<V>& all) {
  std::vector<const V*> v;
  for (const char* name : {"sdpa(cudnn)", "sdpa(flash)"})
    for (const V& peer : all)
      if (peer.name == name) v.push_back(&peer);
  return v;
}
const std::vector<const Variant*>& sdpa_peers() {
  static const std::vector<Variant> all = make_sdpa_peers();
  static const std::vector<const Variant*> picked = pick_sdpa_peers(all);
  return picked;
}
const std::vector<const BwdVariant*>& sdpa_backward_peers() {
  static const std::vector<BwdVariant> all = make_sdpa_backward_peers();
  static const std::vector<const BwdVariant*> picked = pick_sdpa_peers(all);
  return picked;
}

// Our row: the block-sparse forward on `view`, a block mask built from `mask`.
Variant blocksparse_variant(const BlockMaskView& view, const MaskMod& mask, const ScoreMod& score) {
  Variant v;
  v.name = "blocksparse";
  v.rung = "blocksparse_fwd";
  v.unsupported_reason = [view](const AttnProblem& p) { return blocksparse_fwd_unsupported(p, view); };
  v.launch = [view, mask, score](const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
    return blocksparse_fwd(p, b, view, mask, score, s);
  };
  v.workspace_bytes = [](const AttnProblem&) { return blocksparse_fwd_workspace_bytes(); };
  v.describe = [] { return blocksparse_fwd_describe(); };
  return v;
}

// Our backward rows: blocksparse_bwd on `view`, default or deterministic.
BwdVariant blocksparse_bwd_variant(const BlockMaskView& view, const MaskMod& mask, const ScoreMod& score,
                                   bool deterministic) {
  BwdVariant v;
  v.name = deterministic ? "blocksparse-det bwd" : "blocksparse bwd";
  v.rung = "blocksparse_bwd";
  v.unsupported_reason = [view](const AttnProblem& p) { return blocksparse_bwd_unsupported(p, view); };
  v.workspace_bytes = [view](const AttnProblem& p) { return blocksparse_bwd_workspace_bytes(p, view); };
  v.launch = [view, mask, score, deterministic](const AttnProblem& p, const AttnGradBuffers& b, cudaStream_t s) {
    return blocksparse_bwd(p, b, view, mask, score, deterministic, s);
  };
  v.describe = [] { return blocksparse_bwd_describe(); };
  v.deterministic = deterministic;
  return v;
}

// What every row of one run shares.
struct BlocksparseRun {
  BlocksparseRun(const CommonOptions& options, const BlocksparseOptions& blocksparse, uint64_t input_seed,
                 cudaStream_t s)
      : opt(options), bs(blocksparse), seed(input_seed), stream(s) {}
  const CommonOptions& opt;
  const BlocksparseOptions& bs;
  const uint64_t seed;
  const cudaStream_t stream;
  AttnProblem p;       // ours: no causal flag (a causal mask is the mask_mod)
  AttnProblem p_sdpa;  // the SDPA peers': causal by torch's flag where the mask_mod is `causal`
  MaskMod mask;        // its document ids in device memory
  ScoreMod score;
  std::string mask_name;  // as the CSV and the banner say it: "sliding_window:128,0", "document:4"

  ProblemBuffers bufs;  // the forward's: Q, K, V, O, LSE, the fp32 reference's O and LSE, the L2 flush
  GradBuffers grads;    // --bwd: the backward's (its own forward buffers, dO, the gradients, their references)
  GradReference grad_ref;
  DeviceArena arena;    // the block mask, the document ids, the pair counter, the same-precision reference
  BlockMaskView view;   // lists for B (document ids differ per batch; else 1) and H = 1: broadcast
  ReferenceData ref;
  unsigned long long pairs = 0;  // (b, h, q, k) the mask_mod keeps
  double flops = 0;              // 2·(D+Dv)·pairs; --bwd: 2·(3D+2Dv)·pairs
  std::string mask_summary;      // the block mask in one line, for the banner and our CSV note

  Variant ours;
  BwdVariant ours_bwd[2];  // --bwd: default, deterministic
  std::vector<TableRow> rows;
  std::vector<std::function<std::string()>> calls;
};

// The spec parse_mask_mod takes: "document:K" without its count.
std::string mask_spec(const BlocksparseOptions& bs) {
  return bs.mask_mod.rfind("document", 0) == 0 ? std::string("document") : bs.mask_mod;
}

// ==== set-up ==========================================================================

RunError set_up_forward(BlocksparseRun& run);
RunError set_up_backward(BlocksparseRun& run);

// The block mask's allocation and the kernel's refusals first (exit 2 before
// any launch), then the document ids, the block mask built, the kept pairs
// counted, then the forward's or the backward's buffers, inputs and
// (unless --no-check) references.
RunError set_up(BlocksparseRun& run) {
  const CommonOptions& opt = run.opt;
  const BlocksparseOptions& bs = run.bs;
  AttnProblem& p = run.p;
  p = to_problem(opt);
  std::string why;  // the specs passed parse_args
  run.mask = parse_mask_mod(mask_spec(bs), p.Nq, p.Nk, why);
  run.score = parse_score_mod(bs.score_mod.empty() ? "none" : bs.score_mod, p.H, why);
  const bool document = run.mask.kind == MaskModKind::kDocument;
  run.mask_name = document ? "document:" + std::to_string(bs.document_count) : mask_mod_name(run.mask);
  run.p_sdpa = p;
  run.p_sdpa.causal = run.mask.kind == MaskModKind::kCausal;

  const int mask_B = document ? p.B : 1, mask_H = 1;
  if (std::string e = block_mask_gpu_unsupported(mask_B, mask_H, p.Nq, p.Nk, bs.block_q, bs.block_kv); !e.empty())
    return {"the block mask: " + e, kExitBadOptions};
  uint8_t* mask_base = nullptr;
  if (std::string e = run.arena.alloc(block_mask_device_bytes(mask_B, mask_H, p.Nq, p.Nk, bs.block_q, bs.block_kv),
                                      &mask_base, "the block mask");
      !e.empty())
    return e;
  run.view = block_mask_view(mask_base, mask_B, mask_H, p.Nq, p.Nk, bs.block_q, bs.block_kv);
  if (std::string e = opt.bwd ? blocksparse_bwd_unsupported(p, run.view) : blocksparse_fwd_unsupported(p, run.view);
      !e.empty())
    return {std::string(opt.bwd ? "the block-sparse backward: " : "the block-sparse forward: ") + e, kExitBadOptions};

  const cudaStream_t stream = run.stream;
  if (document) {
    const int L = std::max(p.Nq, p.Nk);
    const std::vector<int32_t> ids = random_document_ids(p.B, L, bs.document_count, run.seed);
    int32_t* d_ids = nullptr;
    if (std::string e = run.arena.alloc(ids.size(), &d_ids, "the document ids"); !e.empty()) return e;
    cudaMemcpyAsync(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
    run.mask.doc = d_ids;
    run.mask.doc_len = L;
  }
  run.ours = blocksparse_variant(run.view, run.mask, run.score);
  for (bool det : {false, true}) run.ours_bwd[det] = blocksparse_bwd_variant(run.view, run.mask, run.score, det);
  unsigned long long* d_pairs = nullptr;
  if (std::string e = run.arena.alloc(1, &d_pairs, "the pair counter"); !e.empty()) return e;
  cudaError_t e = build_block_mask_from_mod(run.mask, run.view, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(d_pairs, 0, sizeof *d_pairs, stream);
  if (e == cudaSuccess) e = count_kept_pairs(run.mask, p.B, p.H, p.Nq, p.Nk, d_pairs, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(&run.pairs, d_pairs, sizeof run.pairs, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("building the block mask", e);
  run.flops = (opt.bwd ? 2.0 * (3 * p.D + 2 * p.Dv) : 2.0 * (p.D + p.Dv)) * double(run.pairs);

  // The lists, for the banner: blocks of each kind, and the pairs their blocks hold.
  const BlockMask lists = download_block_mask(run.view);
  long long partial = 0, full = 0;
  for (size_t r = 0; r < lists.kv_count.size(); ++r) partial += lists.kv_count[r], full += lists.full_count[r];
  const double all_pairs = double(p.B) * p.H * p.Nq * p.Nk;
  const double visited = double(lists.visited_pairs()) * (double(p.B) * p.H / (mask_B * mask_H));
  char summary[320];
  std::snprintf(summary, sizeof summary,
                "block mask %dx%d, lists for B=%d H=%d%s: %lld partial + %lld full of %lld blocks; pairs kept %.2f%% "
                "of B·H·Nq·Nk, in the visited blocks %.2f%%",
                bs.block_q, bs.block_kv, mask_B, mask_H, mask_B != p.B || mask_H != p.H ? " (broadcast)" : "", partial,
                full, static_cast<long long>(lists.kv_count.size()) * lists.n_blocks,
                100.0 * double(run.pairs) / all_pairs, 100.0 * visited / all_pairs);
  run.mask_summary = summary;
  return opt.bwd ? set_up_backward(run) : set_up_forward(run);
}

// The forward's buffers, Q, K, V from the seed and, unless --no-check, the
// mods reference's O and LSE, fp32 and same-precision.
RunError set_up_forward(BlocksparseRun& run) {
  const AttnProblem& p = run.p;
  const cudaStream_t stream = run.stream;
  const size_t workspace = blocksparse_fwd_workspace_bytes();  // ours only: torch's rows take none
  if (std::string e = run.bufs.allocate(p, run.opt.check, workspace, workspace, 0); !e.empty()) return e;
  ReferenceData unused;
  if (std::string e = prepare_inputs(p, run.bufs, run.seed, false, stream, &unused); !e.empty()) return e;
  if (!run.opt.check) return {};
  float *o_low = nullptr, *lse_low = nullptr;
  if (std::string err = run.arena.alloc(size_t(p.o_elems()), &o_low, "the same-precision reference"); !err.empty())
    return err;
  if (std::string err = run.arena.alloc(size_t(p.lse_elems()), &lse_low, "the same-precision LSE"); !err.empty())
    return err;
  const AttnBuffers b = run.bufs.attn();
  cudaError_t e = mods_attention_fp32(p, run.mask, run.score, b.q, b.k, b.v, run.bufs.o_ref, run.bufs.lse_ref, false, stream);
  if (e == cudaSuccess) e = mods_attention_fp32(p, run.mask, run.score, b.q, b.k, b.v, o_low, lse_low, true, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("the mask_mod reference", e);
  run.ref.o_ref = run.bufs.o_ref;
  run.ref.lse_ref = run.bufs.lse_ref;
  run.ref.rounding_err = output_rounding_error(run.bufs.o_ref, p.o_elems(), p.dtype, stream);
  const ErrorStats base = compare_output_fp32(o_low, run.bufs.o_ref, p.o_elems(), stream);
  run.ref.baseline_err = base.nonfinite == 0 ? base.max_abs_err : -1;
  return {};
}

// The backward's buffers (the workspace ours asks for), Q, K, V, dO from the
// seed, O and LSE of the fp32 mods reference forward and, unless --no-check,
// the mods reference backward's gradients, fp32 and same-precision.
RunError set_up_backward(BlocksparseRun& run) {
  const AttnProblem& p = run.p;
  if (std::string e = run.grads.allocate(p, run.opt.check, run.ours_bwd[0].workspace_bytes(p)); !e.empty()) return e;
  BackwardReferences refs;
  refs.forward = [&run](const AttnBuffers& in, float* o, float* lse, cudaStream_t s) {
    return mods_attention_fp32(run.p, run.mask, run.score, in.q, in.k, in.v, o, lse, false, s);
  };
  refs.backward = [&run](const AttnBuffers& in, const void* dout, float* dq, float* dk, float* dv, bool low,
                         cudaStream_t s) {
    return mods_attention_backward_fp32(run.p, run.mask, run.score, in.q, in.k, in.v, dout, dq, dk, dv, low, s);
  };
  return prepare_backward_inputs(p, run.grads, run.seed, run.opt.check, run.stream, &run.grad_ref, &refs);
}

// ==== the forward rows ================================================================

// One row run once (into poisoned outputs) and, unless --no-check, checked; its
// call queued for the timed rounds.
void add_row(BlocksparseRun& run, const Variant& v, const AttnProblem& p) {
  TableRow r;
  r.name = v.name;
  r.is_peer = v.is_peer;
  std::function<std::string()> call;
  if (std::string why = v.unsupported_reason(p); !why.empty()) {
    r.status = "unsupported";
    r.note = why;
  } else {
    set_outcome(r, run_and_check(v, p, run.bufs, run.opt.check ? &run.ref : nullptr, run.stream));
    if (r.error.empty()) call = variant_call(v, p, run.bufs.attn(), run.stream);
  }
  run.rows.push_back(r);
  run.calls.push_back(call);
}

// A backward row run once and checked (backward_row), its call queued.
void add_bwd_row(BlocksparseRun& run, const BwdVariant& v, const AttnProblem& p) {
  TableRow r = backward_row(run.opt, v, p, run.grads, run.grad_ref, run.stream);
  run.calls.push_back(r.status.empty() && r.error.empty() ? variant_call(v, p, run.grads.grad(), run.stream)
                                                          : std::function<std::string()>());
  run.rows.push_back(r);
}

// The SDPA peers, forward or backward (where the build has torch, unless
// --no-peers): run where torch's is_causal says the mask, else a row saying why not.
void peer_rows(BlocksparseRun& run) {
  if (!run.opt.sdpa || !have_torch()) return;
  std::string why;
  if (run.mask.kind != MaskModKind::kNone && run.mask.kind != MaskModKind::kCausal)
    why = "torch's SDPA has no mask_mod " + run.mask_name;
  else if (run.score.kind != ScoreModKind::kNone)
    why = "torch's SDPA has no score_mod " + score_mod_name(run.score);
  const auto refused = [&](const std::string& name) {
    TableRow r;
    r.name = name;
    r.is_peer = true;
    r.status = "unsupported";
    r.note = why + " (torch's flex_attention: scripts/bench_blocksparse.py)";
    run.rows.push_back(r);
    run.calls.emplace_back();
  };
  if (run.opt.bwd) {
    for (const BwdVariant* peer : sdpa_backward_peers())
      if (why.empty()) add_bwd_row(run, *peer, run.p_sdpa);
      else refused(peer->name + " bwd");
    return;
  }
  for (const Variant* peer : sdpa_peers())
    if (why.empty()) add_row(run, *peer, run.p_sdpa);
    else refused(peer->name);
}

// ==== the report ======================================================================

void print_header(const BlocksparseRun& run) {
  const CommonOptions& opt = run.opt;
  char banner[320];
  std::snprintf(banner, sizeof banner, " block-sparse%s: %s, mask_mod %s, score_mod %s, Warmup: %d, Iters: %d, Seed: %llu ",
                opt.bwd ? " backward" : "", run.p.shape_string().c_str(), run.mask_name.c_str(),
                score_mod_name(run.score).c_str(), opt.warmup, opt.iters, static_cast<unsigned long long>(run.seed));
  print_banner(banner);
  std::printf("%32s  %s; TFLOPS count %s·kept pairs\n", "blocks", run.mask_summary.c_str(),
              opt.bwd ? "2·(3D+2Dv)" : "2·(D+Dv)");
  if (opt.bwd) {
    std::printf("%32s  O and LSE of the fp32 mods reference forward (O rounded to %s), dO random\n", "forward",
                dtype_name(run.p.dtype));
    if (opt.check) {
      std::string yardstick;
      for (int g = 0; g < kGrads; ++g) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s %.2e", g ? ", " : "", kGradNames[g], run.grad_ref.baseline_err[g]);
        yardstick += buf;
      }
      std::printf("%32s  vs the fp32 mods reference backward; pass, each of dQ, dK, dV: err <= 2 x same-precision "
                  "unfused err (%s) + 2 x rounding\n",
                  "check", yardstick.c_str());
    }
  } else if (opt.check) {
    char baseline[32] = "unavailable";
    if (run.ref.baseline_err >= 0) std::snprintf(baseline, sizeof baseline, "%.2e", run.ref.baseline_err);
    std::printf("%32s  vs the fp32 mask_mod/score_mod reference; pass: err <= 2 x same-precision err (%s) + 2 x "
                "rounding (%.2e), lse <= %.0e\n",
                "check", baseline, run.ref.rounding_err, kLseTolerance);
  }
}

// The rows appended to --csv: the results columns (causal: 1 for the causal
// mask_mod), then mask and score; our row's note says the block mask.
std::string append_csv(const std::string& path, const SystemInfo& sys, const BlocksparseRun& run) {
  const std::string tail = "," + csv_field(run.mask_name) + "," + csv_field(score_mod_name(run.score)) + "\n";
  std::string lines;
  for (TableRow r : run.rows) {
    if (!r.is_peer) r.note += (r.note.empty() ? "" : "; ") + run.mask_summary;
    lines += csv_row(sys, run.p_sdpa, run.seed, r) + tail;
  }
  return append_results_csv(path, lines, kBlocksparseCsvColumns);
}

int fail(const RunError& e) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", e.message.c_str());
  return e.code;
}

}  // namespace

std::string blocksparse_options_unsupported(const CommonOptions& opt, const BlocksparseOptions& bs) {
  const std::string kernel = opt.bwd ? "the block-sparse backward" : "the block-sparse forward";
  int Br = 0, Bc = 0;
  if (std::string e = opt.bwd ? blocksparse_bwd_tile(opt.D, opt.Dv, &Br, &Bc)
                              : blocksparse_fwd_tile(opt.D, opt.Dv, &Br, &Bc);
      !e.empty())
    return kernel + ": " + e;
  if (bs.block_q % Br != 0 || bs.block_kv % Bc != 0)
    return "--block-size " + std::to_string(bs.block_q) + "," + std::to_string(bs.block_kv) +
           " is not a multiple of the kernel tile " + std::to_string(Br) + " x " + std::to_string(Bc) + " of " +
           kernel + " at D = " + std::to_string(opt.D) + (opt.Dv == opt.D ? "" : ", Dv = " + std::to_string(opt.Dv));
  const bool document = mask_spec(bs) == "document";
  if (std::string e = block_mask_gpu_unsupported(document ? opt.B : 1, 1, opt.Nq, opt.Nk, bs.block_q, bs.block_kv);
      !e.empty())
    return "the block mask: " + e;
  return "";
}

std::vector<ListEntry> blocksparse_list(const CommonOptions& opt) {
  std::vector<ListEntry> entries;
  if (opt.bwd) {
    if (opt.sdpa)
      for (const BwdVariant* peer : sdpa_backward_peers())
        entries.push_back({peer->name + " bwd", peer->rung, peer->describe()});
    if (!opt.deterministic) entries.push_back({"blocksparse bwd", "blocksparse_bwd", blocksparse_bwd_describe()});
    entries.push_back({"blocksparse-det bwd", "blocksparse_bwd", blocksparse_bwd_describe() + " (deterministic)"});
    return entries;
  }
  if (opt.sdpa)
    for (const Variant* peer : sdpa_peers()) entries.push_back({peer->name, peer->rung, peer->describe()});
  entries.push_back({"blocksparse", "blocksparse_fwd", blocksparse_fwd_describe()});
  return entries;
}

std::vector<int32_t> random_document_ids(int B, int L, int K, uint64_t seed) {
  std::vector<int32_t> ids(size_t(B) * size_t(L));
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 7);
  for (int b = 0; b < B; ++b) {
    std::set<int> cuts;  // a document starts at each
    while (int(cuts.size()) < K - 1) cuts.insert(1 + int(rng() % uint64_t(L - 1)));
    int id = 0;
    auto next = cuts.begin();
    for (int i = 0; i < L; ++i) {
      if (next != cuts.end() && *next == i) ++id, ++next;
      ids[size_t(b) * L + i] = id;
    }
  }
  return ids;
}

int run_blocksparse_mode(const CommonOptions& opt, const BlocksparseOptions& bs, const SystemInfo& sys, uint64_t seed,
                         cudaStream_t stream) {
  BlocksparseRun run(opt, bs, seed, stream);
  if (RunError e = set_up(run); e.failed()) return fail(e);
  print_header(run);
  // The rows: the peers first, then ours, each run once and checked.
  peer_rows(run);
  if (opt.bwd) {
    for (const BwdVariant& v : run.ours_bwd)
      if (v.deterministic || !opt.deterministic) add_bwd_row(run, v, run.p);
  } else {
    add_row(run, run.ours, run.p);
  }
  bool device_lost = cudaDeviceSynchronize() != cudaSuccess;
  const ProblemBuffers& timed = opt.bwd ? run.grads.fwd : run.bufs;  // its L2 flush
  if (!device_lost)
    device_lost = time_rows(run.rows, run.calls, opt.warmup, opt.iters, timed.flush, timed.flush_bytes, stream);
  const TableScore score = score_rows(run.rows, run.flops);
  print_table(run.rows, score.best_peer_name, /*show_all=*/true);
  std::printf("%s | driver %s | CUDA %s | torch %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(),
              sys.cuda.c_str(), torch_version().c_str(), sys.commit.c_str(), sys.date.c_str());
  if (!opt.csv.empty())
    if (std::string e = append_csv(opt.csv, sys, run); !e.empty()) return fail(RunError(e));
  if (device_lost) return fail(RunError("the GPU reported a fatal error; later rows were not run"));
  if (score.failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", score.failures, score.failures > 1 ? "s" : "");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace attnlab
