// flash_attn_mma's block-sparse mode (--mask-mod, --score-mod, --block-size):
// FlexAttention's forward on one shape. Rows, as the dense table's
// (bench/table.h: run once and checked, then timed together, interleaved):
//   sdpa(cudnn), sdpa(flash)   torch's SDPA where it can say the same mask: the
//                              mask_mod causal or none and no score_mod (in a
//                              torch build, unless --no-peers); causal by torch's
//                              is_causal, so unsupported when Nq != Nk
//   blocksparse                ours: blocksparse_fwd on the block mask that
//                              build_block_mask_from_mod built on the GPU
// torch's compiled flex_attention is not a row: torch compiles it from Python
// (torch.compile), so it runs in scripts/bench_blocksparse.py, beside
// attnlab.flex_attention on the same block mask.
// The check (unless --no-check): O and LSE against mods_attention_fp32
// (kernels/reference/mods_reference.h), the fp32 reference that applies the
// mods pair by pair, by the project's rule, the yardstick its same-precision
// path (P rounded to the dtype before P·V). TFLOPS: 2·(D+Dv)·pairs / time for
// every row, pairs = the (b, h, q, k) the mask_mod keeps, counted exactly on
// the GPU (count_kept_pairs), not the pairs of the blocks the kernel visits
// (the banner gives both).
//
// run_blocksparse_mode, at the bottom, reads as the run does: set_up (the
// problem, the block mask, the inputs, the pair count, the reference), the
// forward rows, the report.
#include "blocksparse_mode.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <utility>

#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/blocksparse_fwd.h"
#include "blocksparse/mods.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"
#include "runner.h"
#include "torch_peers.h"

namespace attnlab {
namespace {

// The SDPA peers this mode runs, in order (make_sdpa_peers' flash, cuDNN, efficient).
const std::vector<const Variant*>& sdpa_peers() {
  static const std::vector<Variant> all = make_sdpa_peers();
  static const std::vector<const Variant*> picked = [] {
    std::vector<const Variant*> v;
    for (const char* name : {"sdpa(cudnn)", "sdpa(flash)"})
      for (const Variant& peer : all)
        if (peer.name == name) v.push_back(&peer);
    return v;
  }();
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
  v.describe = [] { return blocksparse_fwd_describe(); };
  return v;
}

// What every row of one run shares.
struct BlocksparseRun {
  BlocksparseRun(const Options& options, uint64_t input_seed, cudaStream_t s)
      : opt(options), seed(input_seed), stream(s) {}
  const Options& opt;
  const uint64_t seed;
  const cudaStream_t stream;
  AttnProblem p;       // ours: no causal flag (a causal mask is the mask_mod)
  AttnProblem p_sdpa;  // the SDPA peers': causal by torch's flag where the mask_mod is `causal`
  MaskMod mask;        // its document ids in device memory
  ScoreMod score;
  std::string mask_name;  // as the CSV and the banner say it: "sliding_window:128,0", "document:4"

  ProblemBuffers bufs;  // Q, K, V, O, LSE, the fp32 reference's O and LSE, the L2 flush
  DeviceArena arena;    // the block mask, the document ids, the pair counter, the same-precision reference
  BlockMaskView view;   // lists for B (document ids differ per batch; else 1) and H = 1: broadcast
  ReferenceData ref;
  unsigned long long pairs = 0;  // (b, h, q, k) the mask_mod keeps
  double flops = 0;              // 2·(D+Dv)·pairs
  std::string mask_summary;      // the block mask in one line, for the banner and our CSV note

  Variant ours;
  std::vector<TableRow> rows;
  std::vector<std::function<std::string()>> calls;
};

// The spec parse_mask_mod takes: "document:K" without its count.
std::string mask_spec(const Options& opt) {
  return opt.mask_mod.rfind("document", 0) == 0 ? std::string("document") : opt.mask_mod;
}

// ==== set-up ==========================================================================

// The block mask's allocation and the kernel's refusals first (exit 2 before
// any launch), then the buffers, Q, K, V from the seed, the document ids, the
// block mask built, the kept pairs counted and, unless --no-check, the
// references.
RunError set_up(BlocksparseRun& run) {
  const Options& opt = run.opt;
  AttnProblem& p = run.p;
  p = to_problem(opt);
  std::string why;  // the specs passed parse_args
  run.mask = parse_mask_mod(mask_spec(opt), p.Nq, p.Nk, why);
  run.score = parse_score_mod(opt.score_mod.empty() ? "none" : opt.score_mod, p.H, why);
  const bool document = run.mask.kind == MaskModKind::kDocument;
  run.mask_name = document ? "document:" + std::to_string(opt.document_count) : mask_mod_name(run.mask);
  run.p_sdpa = p;
  run.p_sdpa.causal = run.mask.kind == MaskModKind::kCausal;

  const int mask_B = document ? p.B : 1, mask_H = 1;
  if (std::string e = block_mask_gpu_unsupported(mask_B, mask_H, p.Nq, p.Nk, opt.block_q, opt.block_kv); !e.empty())
    return {"the block mask: " + e, kExitBadOptions};
  uint8_t* mask_base = nullptr;
  if (std::string e = run.arena.alloc(block_mask_device_bytes(mask_B, mask_H, p.Nq, p.Nk, opt.block_q, opt.block_kv),
                                      &mask_base, "the block mask");
      !e.empty())
    return e;
  run.view = block_mask_view(mask_base, mask_B, mask_H, p.Nq, p.Nk, opt.block_q, opt.block_kv);
  run.ours = blocksparse_variant(run.view, run.mask, run.score);  // the mask's ids are set below, before any launch
  if (std::string e = blocksparse_fwd_unsupported(p, run.view); !e.empty())
    return {"the block-sparse forward: " + e, kExitBadOptions};

  if (std::string e = run.bufs.allocate(p, opt.check, 0, 0, 0); !e.empty()) return e;
  ReferenceData unused;
  if (std::string e = prepare_inputs(p, run.bufs, run.seed, false, run.stream, &unused); !e.empty()) return e;
  const cudaStream_t stream = run.stream;
  if (document) {
    const int L = std::max(p.Nq, p.Nk);
    const std::vector<int32_t> ids = random_document_ids(p.B, L, opt.document_count, run.seed);
    int32_t* d_ids = nullptr;
    if (std::string e = run.arena.alloc(ids.size(), &d_ids, "the document ids"); !e.empty()) return e;
    cudaMemcpyAsync(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
    run.mask.doc = d_ids;
    run.mask.doc_len = L;
    run.ours = blocksparse_variant(run.view, run.mask, run.score);
  }
  unsigned long long* d_pairs = nullptr;
  if (std::string e = run.arena.alloc(1, &d_pairs, "the pair counter"); !e.empty()) return e;
  cudaError_t e = build_block_mask_from_mod(run.mask, run.view, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(d_pairs, 0, sizeof *d_pairs, stream);
  if (e == cudaSuccess) e = count_kept_pairs(run.mask, p.B, p.H, p.Nq, p.Nk, d_pairs, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(&run.pairs, d_pairs, sizeof run.pairs, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("building the block mask", e);
  run.flops = 2.0 * (p.D + p.Dv) * double(run.pairs);

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
                opt.block_q, opt.block_kv, mask_B, mask_H, mask_B != p.B || mask_H != p.H ? " (broadcast)" : "", partial,
                full, static_cast<long long>(lists.kv_count.size()) * lists.n_blocks,
                100.0 * double(run.pairs) / all_pairs, 100.0 * visited / all_pairs);
  run.mask_summary = summary;

  if (!opt.check) return {};
  float *o_low = nullptr, *lse_low = nullptr;
  if (std::string err = run.arena.alloc(size_t(p.o_elems()), &o_low, "the same-precision reference"); !err.empty())
    return err;
  if (std::string err = run.arena.alloc(size_t(p.lse_elems()), &lse_low, "the same-precision LSE"); !err.empty())
    return err;
  const AttnBuffers b = run.bufs.attn();
  e = mods_attention_fp32(p, run.mask, run.score, b.q, b.k, b.v, run.bufs.o_ref, run.bufs.lse_ref, false, stream);
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
    if (r.error.empty()) call = variant_call(v, p, run.bufs, run.stream);
  }
  run.rows.push_back(r);
  run.calls.push_back(call);
}

// The SDPA peers (where the build has torch, unless --no-peers): run where
// torch's is_causal says the mask, else a row saying why not.
void peer_rows(BlocksparseRun& run) {
  if (!run.opt.sdpa || !have_torch()) return;
  std::string why;
  if (run.mask.kind != MaskModKind::kNone && run.mask.kind != MaskModKind::kCausal)
    why = "torch's SDPA has no mask_mod " + run.mask_name;
  else if (run.score.kind != ScoreModKind::kNone)
    why = "torch's SDPA has no score_mod " + score_mod_name(run.score);
  for (const Variant* peer : sdpa_peers()) {
    if (why.empty()) {
      add_row(run, *peer, run.p_sdpa);
      continue;
    }
    TableRow r;
    r.name = peer->name;
    r.is_peer = true;
    r.status = "unsupported";
    r.note = why + " (torch's flex_attention: scripts/bench_blocksparse.py)";
    run.rows.push_back(r);
    run.calls.emplace_back();
  }
}

// ==== the report ======================================================================

void print_header(const BlocksparseRun& run) {
  const Options& opt = run.opt;
  char banner[320];
  std::snprintf(banner, sizeof banner, " block-sparse: %s, mask_mod %s, score_mod %s, Warmup: %d, Iters: %d, Seed: %llu ",
                run.p.shape_string().c_str(), run.mask_name.c_str(), score_mod_name(run.score).c_str(), opt.warmup,
                opt.iters, static_cast<unsigned long long>(run.seed));
  print_banner(banner);
  std::printf("%32s  %s; TFLOPS count 2·(D+Dv)·kept pairs\n", "blocks", run.mask_summary.c_str());
  if (opt.check) {
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

std::vector<ListEntry> blocksparse_list(const Options& opt) {
  std::vector<ListEntry> entries;
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

int run_blocksparse_mode(const Options& opt, const SystemInfo& sys, uint64_t seed, cudaStream_t stream) {
  BlocksparseRun run(opt, seed, stream);
  if (RunError e = set_up(run); e.failed()) return fail(e);
  print_header(run);
  // The rows: the peers first, then ours, each run once and checked.
  peer_rows(run);
  add_row(run, run.ours, run.p);
  // --bwd adds the backward's rows here, after the forward's (parse_args refuses it
  // until the block-sparse backward exists).
  bool device_lost = cudaDeviceSynchronize() != cudaSuccess;
  if (!device_lost)
    device_lost = time_rows(run.rows, run.calls, opt.warmup, opt.iters, run.bufs.flush, run.bufs.flush_bytes, stream);
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
