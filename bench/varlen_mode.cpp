// flash_attn_mma's variable-length mode (--varlen, --varlen-k, --unverified):
// FlashAttention's varlen forward on one packed batch of sequences. Rows, as
// the dense table's (bench/table.h: run once and checked, then timed together,
// interleaved):
//   varlen (unverified)     ours: varlen_fwd on Q, K, V, O packed [total, heads,
//                           D] and cu_seqlens; named so while its kernel has not
//                           run on a GPU (the program needs --unverified)
//   dense padded (engine)   a yardstick, not a peer: rung 12's engine
//                           (ws+stage2+pingpong) on the batch padded to B x the
//                           longest sequence, timed only; run where every
//                           sequence has as many keys as queries (padding then
//                           keeps each sequence's own mask), else one line says
//                           why not
// The check (unless --no-check), sequence by sequence: its rows of Q, K, V
// unpacked into dense [1, heads, len, D] scratch, the fp32 reference on that
// sequence alone (varlen_seq_problem), our O and LSE unpacked the same way, and
// the project's rule (reference.h: err <= 2 x the unfused baseline's err on
// the same sequence + 2 x rounding, LSE within 1e-3, nothing NaN or unwritten:
// O and LSE are poisoned before the checked launch). A sequence without keys
// must give O = 0 and LSE = -inf. The row's verdict is its worst sequence's.
// TFLOPS: 2·H·(D+Dv)·pairs / time for both rows, pairs =
// varlen_unmasked_pairs_per_head (the packed batch's exact count), so the two
// times, side by side, say what packing saves.
//
// run_varlen_mode, at the bottom, reads as the run does: set_up (lengths,
// offsets, the kernel's refusals, buffers, inputs), the rows, the report.
#include "varlen_mode.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <utility>

#include "host/launch.h"
#include "host/variant.h"
#include "reference/reference.h"
#include "runner.h"
#include "sequence_check.h"
#include "torch_peers.h"
#include "varlen/varlen.h"
#include "varlen/varlen_schedule.h"

namespace attnlab {
namespace {

constexpr const char* kOursName = "varlen (unverified)";
constexpr const char* kPaddedName = "dense padded (engine)";
constexpr const char* kEngineVariant = "ws+stage2+pingpong";  // rung 12, the engine varlen_fwd is built on

// What every row of one run shares.
struct VarlenRun {
  VarlenRun(const CommonOptions& options, const VarlenOptions& varlen, uint64_t input_seed, cudaStream_t s)
      : opt(options), vo(varlen), seed(input_seed), stream(s) {}
  const CommonOptions& opt;
  const VarlenOptions& vo;
  const uint64_t seed;
  const cudaStream_t stream;

  std::vector<int> len_q, len_k;  // per sequence
  std::vector<int> cu_q, cu_k;    // B + 1 offsets each
  VarlenProblem vp;               // shape.B sequences, shape.Nq / Nk the longest
  int64_t pairs = 0;              // unmasked (query, key) pairs of one head over the batch
  double flops = 0;               // 2·H·(D+Dv)·pairs

  DeviceArena arena;  // Q, K, V, O, LSE, cu_seqlens, the workspace, the L2 flush
  VarlenBuffers bufs;
  void* flush = nullptr;
  size_t flush_bytes = 0;

  AttnProblem padded;                // the yardstick's problem: B x the longest length
  ProblemBuffers padded_bufs;        // its own Q, K, V, O, LSE (the padding random too)
  std::string packing;               // the line after the table comparing the two rows

  std::vector<TableRow> rows;
  std::vector<std::function<std::string()>> calls;
};

std::vector<int> offsets(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];  // parse_args bounds the sum
  return cu;
}

// varlen_fwd_describe's line for the problem's head dims, else all of them in one line.
std::string describe_line(int D, int Dv) {
  const std::string all = varlen_fwd_describe();
  const std::string head = "D=" + std::to_string(D) + (Dv == D ? "" : " Dv=" + std::to_string(Dv)) + ":";
  std::string joined;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    const std::string line = all.substr(start, end - start);
    if (line.rfind(head, 0) == 0) return line;
    if (!line.empty()) joined += (joined.empty() ? "" : "; ") + line;
    start = end + 1;
  }
  return joined;
}

// ==== set-up ==========================================================================

// The lengths and offsets, the kernel's refusals (exit 2 before any launch),
// then the device buffers and Q, K, V from the seed.
RunError set_up(VarlenRun& run) {
  varlen_lengths(run.vo, run.seed, &run.len_q, &run.len_k);
  run.cu_q = offsets(run.len_q);
  run.cu_k = offsets(run.len_k);
  VarlenProblem& vp = run.vp;
  vp.shape = to_problem(run.opt);
  AttnProblem& p = vp.shape;
  p.B = int(run.len_q.size());
  p.Nq = *std::max_element(run.len_q.begin(), run.len_q.end());
  p.Nk = *std::max_element(run.len_k.begin(), run.len_k.end());
  vp.total_q = run.cu_q.back();
  vp.total_k = run.cu_k.back();
  if (std::string e = varlen_lengths_invalid(vp, run.cu_q, run.cu_k); !e.empty())
    return {"the lengths: " + e, kExitBadOptions};
  if (std::string e = varlen_fwd_unsupported(vp); !e.empty())
    return {"the variable-length forward: " + e, kExitBadOptions};
  run.pairs = varlen_unmasked_pairs_per_head(vp, run.cu_q, run.cu_k);
  run.flops = 2.0 * p.H * double(p.D + p.Dv) * double(run.pairs);

  const size_t q_elems = size_t(vp.total_q) * p.H * p.D, o_elems = size_t(vp.total_q) * p.H * p.Dv;
  const size_t k_elems = size_t(vp.total_k) * p.kv_heads() * p.D, v_elems = size_t(vp.total_k) * p.kv_heads() * p.Dv;
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  int *cu_q = nullptr, *cu_k = nullptr;
  uint8_t *workspace = nullptr, *flush = nullptr;
  int device = 0, l2_bytes = 0;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
  run.flush_bytes = size_t(std::max(l2_bytes, 1 << 20)) * 2;
  const size_t workspace_bytes = varlen_fwd_workspace_bytes(vp);
  DeviceArena& a = run.arena;
  for (std::string e : {a.alloc(q_elems, &q, "Q"), a.alloc(k_elems, &k, "K"), a.alloc(v_elems, &v, "V"),
                        a.alloc(o_elems, &o, "O"), a.alloc(size_t(vp.total_q) * p.H, &run.bufs.lse, "LSE"),
                        a.alloc(run.cu_q.size(), &cu_q, "cu_seqlens_q"),
                        a.alloc(run.cu_k.size(), &cu_k, "cu_seqlens_k"),
                        a.alloc(workspace_bytes, &workspace, "the workspace"),
                        a.alloc(run.flush_bytes, &flush, "the L2 flush")})
    if (!e.empty()) return e;
  run.bufs.q = q;
  run.bufs.k = k;
  run.bufs.v = v;
  run.bufs.o = o;
  run.bufs.cu_seqlens_q = cu_q;
  run.bufs.cu_seqlens_k = cu_k;
  run.bufs.workspace = workspace;
  run.bufs.workspace_bytes = workspace_bytes;
  run.flush = flush;

  // Three independent streams of numbers from one seed, as the dense programs' inputs.
  const cudaStream_t s = run.stream;
  cudaError_t e = cudaMemcpyAsync(cu_q, run.cu_q.data(), run.cu_q.size() * sizeof(int), cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(cu_k, run.cu_k.data(), run.cu_k.size() * sizeof(int), cudaMemcpyHostToDevice, s);
  const std::pair<void*, size_t> inputs[3] = {{q, q_elems}, {k, k_elems}, {v, v_elems}};
  for (int i = 0; i < 3 && e == cudaSuccess; ++i)
    if (inputs[i].second > 0)  // a batch without keys has no K, V to fill
      e = fill_random_normal(inputs[i].first, int64_t(inputs[i].second), p.dtype, run.seed * 3 + uint64_t(i), s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return cuda_error_text("filling the inputs", e);
  return {};
}

// ==== our row =========================================================================

// One launch of ours on the run's buffers: "" or the kernel's own words.
std::string launch_ours(const VarlenRun& run) {
  launch_detail().clear();
  const cudaError_t e = varlen_fwd(run.vp, run.bufs, run.stream);
  if (e == cudaSuccess) return "";
  return launch_detail().empty() ? std::string(cudaGetErrorString(e)) : launch_detail();
}

// Sequence b's Q, K, V unpacked into `sc`, its reference and the unfused
// baseline's error on it (sequence_reference), our O and LSE unpacked beside
// them; then the rule's verdict.
RunError check_sequence(const VarlenRun& run, const SequenceScratch& sc, int b, CheckResult* verdict) {
  const VarlenProblem& vp = run.vp;
  const AttnProblem& p = vp.shape;
  const VarlenSeq seq = varlen_seq(run.cu_q.data(), run.cu_k.data(), b, vp.total_q, vp.total_k);
  const AttnProblem sp = varlen_seq_problem(p, seq);
  const cudaStream_t s = run.stream;
  const int kv_heads = p.kv_heads();
  cudaError_t e = unpack_rows(sc.q, run.bufs.q, seq.q0, seq.len_q, p.H, p.D, s);
  if (seq.len_k > 0) {
    if (e == cudaSuccess) e = unpack_rows(sc.k, run.bufs.k, seq.k0, seq.len_k, kv_heads, p.D, s);
    if (e == cudaSuccess) e = unpack_rows(sc.v, run.bufs.v, seq.k0, seq.len_k, kv_heads, p.Dv, s);
  }
  if (e != cudaSuccess) return cuda_error_text("unpacking Q, K and V", e);
  ReferenceData ref;
  if (RunError err = sequence_reference(sp, sc, s, &ref); err.failed()) return err;

  // Ours: O rows as Q's; LSE [H, total_q], entries q0.. of every head.
  e = unpack_rows(sc.o, run.bufs.o, seq.q0, seq.len_q, p.H, p.Dv, s);
  for (int h = 0; h < p.H && e == cudaSuccess; ++h)
    e = cudaMemcpyAsync(sc.lse + size_t(h) * seq.len_q, run.bufs.lse + size_t(h) * vp.total_q + seq.q0,
                        size_t(seq.len_q) * sizeof(float), cudaMemcpyDeviceToDevice, s);
  if (e != cudaSuccess) return cuda_error_text("unpacking O and LSE", e);
  *verdict = check_outputs(sp, sc.o, sc.lse, ref, s);
  return {};
}

// Every sequence with query rows checked (check_sequence); the row holds the
// worst one's verdict, and its note says which sequence that is.
RunError check_ours(VarlenRun& run, TableRow& row) {
  const AttnProblem& p = run.vp.shape;
  SequenceScratch sc;
  size_t unfused_bytes = 0;  // the largest one-KV-head S of a sequence
  for (int b = 0; b < p.B; ++b)
    if (run.len_q[size_t(b)] > 0 && run.len_k[size_t(b)] > 0) {
      AttnProblem sp = p;
      sp.B = 1, sp.Nq = run.len_q[size_t(b)], sp.Nk = run.len_k[size_t(b)];
      unfused_bytes = std::max(unfused_bytes, unfused_workspace_granule(sp));
    }
  DeviceArena scratch;
  if (std::string e = allocate_sequence_scratch(scratch, p, unfused_bytes, &sc); !e.empty()) return e;

  int checked = 0, worst = -1;
  CheckResult worst_verdict;
  bool pass = true;
  for (int b = 0; b < p.B; ++b) {
    if (run.len_q[size_t(b)] == 0) continue;  // no query row: nothing to check
    CheckResult verdict;
    if (RunError e = check_sequence(run, sc, b, &verdict); e.failed()) return e;
    ++checked;
    pass = pass && verdict.pass;
    if (worst < 0 || worse_verdict(verdict, worst_verdict)) worst = b, worst_verdict = verdict;
  }
  row.checked = true;
  row.pass = pass;
  if (worst < 0) {
    row.check_note = "PASS (no query rows to check)";
    row.lse_err = 0;
    return {};
  }
  row.err = worst_verdict.err;
  row.tol = worst_verdict.tol;
  row.lse_err = worst_verdict.lse_err;
  char where[128];
  std::snprintf(where, sizeof where, "; worst of %d sequences: #%d (%d x %d)", checked, worst,
                run.len_q[size_t(worst)], run.len_k[size_t(worst)]);
  row.check_note = worst_verdict.summary() + where;
  return {};
}

// Our row: run once into poisoned O and LSE, checked unless --no-check, its
// call queued for the timed rounds.
RunError add_our_row(VarlenRun& run) {
  TableRow r;
  r.name = kOursName;
  const VarlenProblem& vp = run.vp;
  const AttnProblem& p = vp.shape;
  const size_t o_bytes = size_t(vp.total_q) * p.H * p.Dv * kInputElementBytes;
  cudaError_t e = cudaMemsetAsync(run.bufs.o, 0xFF, o_bytes, run.stream);  // NaN: unwritten elements are caught
  if (e == cudaSuccess)
    e = cudaMemsetAsync(run.bufs.lse, 0xFF, size_t(vp.total_q) * p.H * sizeof(float), run.stream);
  if (e != cudaSuccess) return cuda_error_text("poisoning O and LSE", e);
  r.error = launch_ours(run);
  if (r.error.empty())
    if (const cudaError_t sync = cudaStreamSynchronize(run.stream); sync != cudaSuccess)
      r.error = cudaGetErrorString(sync);
  std::function<std::string()> call;
  if (r.error.empty()) {
    if (run.opt.check)
      if (RunError err = check_ours(run, r); err.failed()) return err;
    read_first_values(run.bufs.o, int64_t(o_bytes / kInputElementBytes), p.dtype, r.first_values);
    call = [&run] { return launch_ours(run); };
  }
  run.rows.push_back(r);
  run.calls.push_back(call);
  return {};
}

// ==== the yardstick ===================================================================

// "dense padded (engine)": rung 12's engine on the batch padded to B x the
// longest sequence, run once, timed only; or a row saying why it cannot run.
void add_padded_row(VarlenRun& run) {
  TableRow r;
  r.name = kPaddedName;
  const AttnProblem& p = run.vp.shape;
  const Variant* engine = find_variant<Variant>(kEngineVariant);
  run.padded = p;
  run.padded.Nk = run.padded.Nq;
  std::string why;
  if (run.len_q != run.len_k)
    why = "the padded batch needs as many keys as queries in every sequence (--varlen-k gives others)";
  else if (p.Nq == 0)
    why = "every sequence is empty";
  else if (engine == nullptr)
    why = std::string(kEngineVariant) + " is not registered";
  else if (std::string e = engine->unsupported_reason(run.padded); !e.empty())
    why = std::string(kEngineVariant) + ": " + e;
  else if (std::string e = run.padded_bufs.allocate(run.padded, false, engine->workspace_bytes(run.padded),
                                                    engine->workspace_bytes(run.padded), 0);
           !e.empty())
    why = "the padded batch: " + e;
  std::function<std::string()> call;
  if (!why.empty()) {
    r.status = "unsupported";
    r.note = why;
  } else {
    ReferenceData unused;
    r.error = prepare_inputs(run.padded, run.padded_bufs, run.seed, false, run.stream, &unused);
    if (r.error.empty()) set_outcome(r, run_and_check(*engine, run.padded, run.padded_bufs, nullptr, run.stream));
    if (r.error.empty()) call = variant_call(*engine, run.padded, run.padded_bufs.attn(), run.stream);
    char note[160];
    std::snprintf(note, sizeof note, "%s on B=%d x %d rows, timed only; TFLOPS on the packed batch's pairs",
                  kEngineVariant, p.B, p.Nq);
    if (r.error.empty()) r.note = note;
  }
  run.rows.push_back(r);
  run.calls.push_back(call);
}

// ==== the report ======================================================================

void print_header(const VarlenRun& run) {
  const CommonOptions& opt = run.opt;
  const AttnProblem& p = run.vp.shape;
  std::string lengths = (run.vo.q.random() ? run.vo.q.text + " = " : "") + varlen_lengths_summary(run.len_q);
  if (run.vo.k.given())
    lengths += ", keys " + (run.vo.k.random() ? run.vo.k.text + " = " : "") + varlen_lengths_summary(run.len_k);
  char banner[512];
  std::snprintf(banner, sizeof banner, " %s, lengths %s, Warmup: %d, Iters: %d, Seed: %llu ",
                run.vp.shape_string().c_str(), lengths.c_str(), opt.warmup, opt.iters,
                static_cast<unsigned long long>(run.seed));
  print_banner(banner);
  std::printf("%32s  %s (UNVERIFIED: this kernel has not run on a GPU before)\n", "varlen_fwd",
              describe_line(p.D, p.Dv).c_str());
  const double rectangle = double(p.B) * double(p.Nq) * double(p.Nk);  // every pair of the padded batch
  std::printf("%32s  %lld unmasked pairs per head over %d sequences, %.1f%% of B x longest Nq x longest Nk; TFLOPS "
              "count 2·(D+Dv)·pairs\n",
              "pairs", static_cast<long long>(run.pairs), p.B,
              rectangle > 0 ? 100.0 * double(run.pairs) / rectangle : 0.0);
  if (opt.check)
    std::printf("%32s  sequence by sequence vs the fp32 reference; pass: err <= 2 x unfused err on the sequence + 2 x "
                "rounding, lse <= %.0e; the row: its worst sequence\n",
                "check", kLseTolerance);
}

// The line after the table: the two rows' times, what packing saves.
void print_packing(const std::vector<TableRow>& rows) {
  const TableRow* ours = nullptr;
  const TableRow* padded = nullptr;
  for (const TableRow& r : rows) {
    if (r.name == kOursName) ours = &r;
    if (r.name == kPaddedName) padded = &r;
  }
  if (!ours || !padded || !ours->ran() || !padded->ran()) return;
  std::printf("packing: %s %.3f ms vs %s %.3f ms: %s\n", kOursName, ours->timing.median_ms, kPaddedName,
              padded->timing.median_ms, faster_or_slower(padded->timing.median_ms / ours->timing.median_ms).c_str());
}

// The rows appended to --csv: the results columns (B the sequences, Nq and Nk
// the longest), then lengths, lengths_k, total_q, total_k, unverified.
std::string append_csv(const std::string& path, const SystemInfo& sys, const VarlenRun& run) {
  const std::string tail = "," + csv_field(run.vo.q.text) + "," + csv_field(run.vo.k.text) + "," +
                           std::to_string(run.vp.total_q) + "," + std::to_string(run.vp.total_k) + ",1\n";
  std::string lines;
  for (const TableRow& r : run.rows) lines += csv_row(sys, run.vp.shape, run.seed, r) + tail;
  return append_results_csv(path, lines, kVarlenCsvColumns);
}

int fail(const RunError& e) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", e.message.c_str());
  return e.code;
}

}  // namespace

std::vector<int> draw_lengths(const VarlenLengths& l, uint64_t seed, uint64_t salt) {
  if (!l.random()) return l.lengths;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + salt);
  const uint64_t span = 2 * uint64_t(l.random_mean) - 1;
  std::vector<int> lengths(size_t(l.random_count));
  for (int& len : lengths) len = 1 + int(rng() % span);
  return lengths;
}

void varlen_lengths(const VarlenOptions& v, uint64_t seed, std::vector<int>* q, std::vector<int>* k) {
  *q = draw_lengths(v.q, seed, 11);
  *k = v.k.given() ? draw_lengths(v.k, seed, 13) : *q;
}

std::string varlen_options_unsupported(const VarlenOptions& v) {
  if (!v.unverified) return "the variable-length kernel has not run on a GPU yet; pass --unverified to run it anyway";
  return "";
}

std::vector<ListEntry> varlen_list() {
  std::vector<ListEntry> entries;
  std::string ours = varlen_fwd_describe();
  for (size_t at; (at = ours.find('\n')) != std::string::npos;) ours.replace(at, 1, at + 1 == ours.size() ? "" : "; ");
  entries.push_back({kOursName, "varlen_fwd", ours});
  const Variant* engine = find_variant<Variant>(kEngineVariant);
  entries.push_back({kPaddedName, engine ? engine->rung : "",
                     engine ? "the batch padded to B x the longest sequence on " + std::string(kEngineVariant) + ": " +
                                  engine->describe()
                            : std::string(kEngineVariant) + " is not registered"});
  return entries;
}

std::string varlen_lengths_summary(const std::vector<int>& lengths) {
  constexpr size_t kAll = 8, kFirst = 4;  // every length up to kAll of them, else the first kFirst
  std::string s;
  for (size_t i = 0; i < lengths.size() && i < (lengths.size() <= kAll ? kAll : kFirst); ++i)
    s += (i ? "," : "") + std::to_string(lengths[i]);
  if (lengths.size() <= kAll) return s;
  int64_t sum = 0;
  for (int len : lengths) sum += len;
  char tail[128];
  std::snprintf(tail, sizeof tail, ",... (%zu sequences, %d to %d, mean %.1f)", lengths.size(),
                *std::min_element(lengths.begin(), lengths.end()), *std::max_element(lengths.begin(), lengths.end()),
                double(sum) / double(lengths.size()));
  return s + tail;
}

int run_varlen_mode(const CommonOptions& opt, const VarlenOptions& v, const SystemInfo& sys, uint64_t seed,
                    cudaStream_t stream) {
  VarlenRun run(opt, v, seed, stream);
  if (RunError e = set_up(run); e.failed()) return fail(e);
  print_header(run);
  // The rows: ours, run once and checked, then the padded yardstick.
  if (RunError e = add_our_row(run); e.failed()) return fail(e);
  bool device_lost = cudaDeviceSynchronize() != cudaSuccess;
  if (!device_lost) add_padded_row(run);
  device_lost = device_lost || cudaDeviceSynchronize() != cudaSuccess;
  if (!device_lost)
    device_lost = time_rows(run.rows, run.calls, opt.warmup, opt.iters, run.flush, run.flush_bytes, stream);
  const TableScore score = score_rows(run.rows, run.flops);
  print_table(run.rows, score.best_peer_name, /*show_all=*/true);
  print_packing(run.rows);
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
