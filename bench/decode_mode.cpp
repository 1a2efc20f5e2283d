// flash_attn_mma's paged-decoding mode (--decode, --Nq, --page-size,
// --no-causal, --unverified): decoding against a paged KV cache, as
// FlashAttention's flash_attn_with_kvcache with a block table. Rows, as the
// dense table's (bench/table.h: run once and checked, then timed together,
// interleaved):
//   decode (unverified)   ours: paged_decode (kernels/varlen/paged_decode.h) on
//                         q [B, Nq, H, D], the cache [pages, page_size, Hkv, D]
//                         and its block table; named so while its kernel has
//                         not run on a GPU (the program needs --unverified)
//   copy (bandwidth)      a yardstick, not a peer: a device-to-device
//                         cudaMemcpyAsync of 1 GiB (less where that does not
//                         fit) in the same rounds. Decoding reads each key once
//                         per KV head and does little with it, so memory bounds
//                         it: its rate beside the copy's says how near it comes
// The cache (set_up): each sequence's keys in pages of --page-size rows, the
// pages a random permutation of the cache's from the seed, unread table
// entries -1, kDecodeSparePages pages no sequence reads; q and the whole
// cache from fill_random_normal, as the dense programs' inputs.
// The check (unless --no-check), sequence by sequence: its q rows transposed
// into dense [1, H, Nq, D], its K and V gathered through its row of the table
// into dense [1, Hkv, L, D] (a copy per page), the fp32 reference on that
// sequence alone (B = 1, Nk = L; causal is bottom-right, the new tokens being
// the cache's last Nq keys), our O transposed as q and our LSE [H, Nq] as it
// is, and the project's rule (sequence_check.h: err <= 2 x the unfused
// baseline's err on the sequence + 2 x rounding, LSE within 1e-3, nothing NaN
// or unwritten: O and LSE are poisoned before the checked launch). A sequence
// without keys must give O = 0 and LSE = -inf. The row's verdict is its worst
// sequence's.
// TFLOPS: 2·H·(D+Dv)·pairs / time, pairs = paged_decode_pairs_per_head (the
// copy row has none). GB/s: the bytes the problem must move / time, K and V of
// every cache once (L·Hkv·(D+Dv)·2 bytes), q read and O written (not the
// kernel's own fp32 partial results, nor the block table); the copy's, its
// bytes read and written. Each row's GB/s also as a fraction of the copy's.
//
// run_decode_mode, at the bottom, reads as the run does: set_up (lengths, the
// cache's shape, the kernel's refusals, buffers, the block table, inputs), the
// rows, the report.
#include "decode_mode.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <utility>

#include "host/device.h"
#include "host/launch.h"
#include "reference/reference.h"
#include "runner.h"
#include "sequence_check.h"
#include "torch_peers.h"
#include "varlen/paged_decode.h"
#include "varlen_mode.h"

namespace attnlab {
namespace {

constexpr const char* kOursName = "decode (unverified)";
constexpr const char* kCopyName = "copy (bandwidth)";
constexpr size_t kCopyBytes = size_t(1) << 30;        // the copy's buffer, read once and written once per call
constexpr size_t kLeastCopyBytes = size_t(64) << 20;  // it is halved down to this where 1 GiB does not fit
constexpr uint64_t kLengthSalt = 17;                  // random: lengths, a stream apart from the pages'
constexpr uint64_t kPageSalt = 19;                    // the pages' permutation

// What every row of one run shares.
struct DecodeRun {
  DecodeRun(const CommonOptions& options, const DecodeOptions& decode, uint64_t input_seed, cudaStream_t s)
      : opt(options), dec(decode), seed(input_seed), stream(s) {}
  const CommonOptions& opt;
  const DecodeOptions& dec;
  const uint64_t seed;
  const cudaStream_t stream;

  std::vector<int> lengths;  // the cache length of each sequence
  std::vector<int> table;    // the block table, host copy: B x max_pages
  PagedDecodeProblem dp;     // shape.Nk: the longest cache (the CSV's Nk; the kernel reads the lengths)
  int splits = 0;            // blocks over each sequence's keys (flash-decoding)
  int64_t keys = 0;          // every cache's keys
  int64_t pairs = 0;         // unmasked (query, key) pairs of one head over the batch
  double flops = 0;          // 2·H·(D+Dv)·pairs
  double kv_bytes = 0;       // K and V of every cache, read once
  double qo_bytes = 0;       // q read and O written

  DeviceArena arena;  // q, the cache, O, LSE, the table, the lengths, the workspace, the L2 flush
  PagedDecodeBuffers bufs;
  void* flush = nullptr;
  size_t flush_bytes = 0;

  DeviceArena copy_arena;  // the copy row's two buffers

  std::vector<TableRow> rows;
  std::vector<std::function<std::string()>> calls;
  std::vector<double> row_bytes;  // the bytes each row moves per call
};

double gib(double bytes) { return bytes / double(1u << 30); }

// paged_decode_describe's line for the problem's head dim and its closing
// line, or all of them in one line.
std::string describe_line(int D) {
  std::vector<std::string> lines;
  const std::string all = paged_decode_describe();
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) lines.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  const std::string head = "D=" + std::to_string(D) + ":";
  for (const std::string& line : lines)
    if (line.rfind(head, 0) == 0) return line + "; " + lines.back();
  std::string joined;
  for (const std::string& line : lines) joined += (joined.empty() ? "" : "; ") + line;
  return joined;
}

// The lengths as the CSV gives them: as typed, and for random: what was drawn.
std::string lengths_text(const DecodeRun& run) {
  const VarlenLengths& l = run.dec.lengths;
  return l.random() ? l.text + " = " + varlen_lengths_summary(run.lengths) : l.text;
}

// The lengths as the banner gives them: a long list shortened.
std::string lengths_summary(const DecodeRun& run) {
  const VarlenLengths& l = run.dec.lengths;
  return (l.random() ? l.text + " = " : "") + varlen_lengths_summary(run.lengths);
}

// ==== set-up ==========================================================================

// The lengths and the cache's shape, the kernel's refusals (exit 2 before any
// launch), the device buffers, then the block table (built on the host only
// once its device copy has fitted: B x max_pages entries may be many) and the
// inputs from the seed.
RunError set_up(DecodeRun& run) {
  run.lengths = decode_lengths(run.dec, run.seed);
  const std::vector<int>& lengths = run.lengths;
  const DecodeCacheShape cache = decode_cache_shape(lengths, run.dec.page_size);
  PagedDecodeProblem& dp = run.dp;
  dp.shape = to_problem(run.opt);
  AttnProblem& p = dp.shape;
  p.B = int(lengths.size());
  p.Nk = *std::max_element(lengths.begin(), lengths.end());
  dp.page_size = run.dec.page_size;
  dp.max_pages = cache.max_pages;
  if (cache.num_pages > INT_MAX)
    return {"the cache needs " + std::to_string(cache.num_pages) + " pages of " + std::to_string(dp.page_size) +
                " rows, more than int32 page numbers address (a larger --page-size needs fewer)",
            kExitBadOptions};
  dp.num_pages = int(cache.num_pages);
  if (std::string e = paged_decode_unsupported(dp); !e.empty()) return {"paged decoding: " + e, kExitBadOptions};
  run.splits = paged_decode_splits(dp, device_sm_count());
  run.pairs = paged_decode_pairs_per_head(dp, lengths);
  run.flops = 2.0 * p.H * double(p.D + p.Dv) * double(run.pairs);
  for (int len : lengths) run.keys += len;
  run.kv_bytes = double(run.keys) * p.kv_heads() * double(p.D + p.Dv) * double(kInputElementBytes);
  run.qo_bytes = double(p.B) * p.Nq * p.H * double(p.D + p.Dv) * double(kInputElementBytes);

  const size_t rows = size_t(p.B) * p.Nq * p.H;  // rows of q and O
  const size_t cache_rows = size_t(dp.num_pages) * size_t(dp.page_size) * p.kv_heads();
  const size_t k_elems = cache_rows * p.D, v_elems = cache_rows * p.Dv;
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  int *table = nullptr, *seqlens = nullptr;
  uint8_t *workspace = nullptr, *flush = nullptr;
  int device = 0, l2_bytes = 0;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
  run.flush_bytes = size_t(std::max(l2_bytes, 1 << 20)) * 2;
  const size_t workspace_bytes = paged_decode_workspace_bytes(dp);
  DeviceArena& a = run.arena;
  for (std::string e : {a.alloc(k_elems, &k, "the K cache"), a.alloc(v_elems, &v, "the V cache"),
                        a.alloc(rows * p.D, &q, "q"), a.alloc(rows * p.Dv, &o, "O"),
                        a.alloc(rows, &run.bufs.lse, "LSE"),
                        a.alloc(size_t(p.B) * dp.max_pages, &table, "the block table"),
                        a.alloc(size_t(p.B), &seqlens, "cache_seqlens"),
                        a.alloc(workspace_bytes, &workspace, "the workspace"),
                        a.alloc(run.flush_bytes, &flush, "the L2 flush")})
    if (!e.empty()) return e;
  run.bufs.q = q;
  run.bufs.k_cache = k;
  run.bufs.v_cache = v;
  run.bufs.o = o;
  run.bufs.block_table = table;
  run.bufs.cache_seqlens = seqlens;
  run.bufs.workspace = workspace;
  run.bufs.workspace_bytes = workspace_bytes;
  run.flush = flush;

  run.table = decode_block_table(lengths, dp.page_size, dp.max_pages, dp.num_pages, run.seed);
  if (std::string e = paged_decode_tables_invalid(dp, run.table, lengths); !e.empty())
    return {"the block table: " + e, kExitBadOptions};

  // Three independent streams of numbers from one seed, as the dense programs' inputs.
  const cudaStream_t s = run.stream;
  cudaError_t e =
      cudaMemcpyAsync(table, run.table.data(), run.table.size() * sizeof(int), cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(seqlens, lengths.data(), lengths.size() * sizeof(int), cudaMemcpyHostToDevice, s);
  const std::pair<void*, size_t> inputs[3] = {{q, rows * p.D}, {k, k_elems}, {v, v_elems}};
  for (int i = 0; i < 3 && e == cudaSuccess; ++i)
    e = fill_random_normal(inputs[i].first, int64_t(inputs[i].second), p.dtype, run.seed * 3 + uint64_t(i), s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return cuda_error_text("filling the inputs", e);
  return {};
}

// ==== our row =========================================================================

// One launch of ours on the run's buffers: "" or the kernel's own words.
std::string launch_ours(const DecodeRun& run) {
  launch_detail().clear();
  const cudaError_t e = paged_decode(run.dp, run.bufs, run.stream);
  if (e == cudaSuccess) return "";
  return launch_detail().empty() ? std::string(cudaGetErrorString(e)) : launch_detail();
}

// Sequence b's K and V, dense [Hkv, L, D] in sc.k and sc.v: its pages copied
// in key order into `staging` ([L, Hkv, D], a cache row holding every KV
// head), then each head's rows copied out of it.
cudaError_t gather_kv(const DecodeRun& run, const SequenceScratch& sc, void* staging, int b) {
  const AttnProblem& p = run.dp.shape;
  const int64_t L = run.lengths[size_t(b)], P = run.dp.page_size;
  const int kv_heads = p.kv_heads();
  const struct {
    const void* cache;
    void* dense;
    int width;
  } tensors[2] = {{run.bufs.k_cache, sc.k, p.D}, {run.bufs.v_cache, sc.v, p.Dv}};
  for (const auto& t : tensors) {
    const size_t row_bytes = size_t(kv_heads) * t.width * kInputElementBytes;
    for (int64_t j = 0; j * P < L; ++j) {
      const int page = run.table[size_t(b) * run.dp.max_pages + size_t(j)];
      const size_t rows = size_t(std::min(P, L - j * P));
      if (cudaError_t e = cudaMemcpyAsync(static_cast<char*>(staging) + size_t(j * P) * row_bytes,
                                          static_cast<const char*>(t.cache) + size_t(page) * size_t(P) * row_bytes,
                                          rows * row_bytes, cudaMemcpyDeviceToDevice, run.stream);
          e != cudaSuccess)
        return e;
    }
    if (cudaError_t e = unpack_rows(t.dense, staging, 0, int(L), kv_heads, t.width, run.stream); e != cudaSuccess)
      return e;
  }
  return cudaSuccess;
}

// Sequence b's q, K and V laid out dense in `sc`, its reference and the
// unfused baseline's error on it (sequence_reference), our O and LSE beside
// them; then the rule's verdict.
RunError check_sequence(const DecodeRun& run, const SequenceScratch& sc, void* staging, int b, CheckResult* verdict) {
  const AttnProblem& p = run.dp.shape;
  AttnProblem sp = p;
  sp.B = 1;
  sp.Nk = run.lengths[size_t(b)];
  const cudaStream_t s = run.stream;
  // q [B, Nq, H, D]: the sequence's Nq rows of H heads, transposed to [H, Nq, D].
  cudaError_t e = unpack_rows(sc.q, run.bufs.q, int64_t(b) * p.Nq, p.Nq, p.H, p.D, s);
  if (e == cudaSuccess && sp.Nk > 0) e = gather_kv(run, sc, staging, b);
  if (e != cudaSuccess) return cuda_error_text("gathering one sequence's q, K and V", e);
  ReferenceData ref;
  if (RunError err = sequence_reference(sp, sc, s, &ref); err.failed()) return err;

  // Ours: O [B, Nq, H, Dv] transposed as q; LSE [B, H, Nq], the sequence's [H, Nq] as it is.
  e = unpack_rows(sc.o, run.bufs.o, int64_t(b) * p.Nq, p.Nq, p.H, p.Dv, s);
  if (e != cudaSuccess) return cuda_error_text("unpacking O", e);
  *verdict = check_outputs(sp, sc.o, run.bufs.lse + size_t(b) * p.H * p.Nq, ref, s);
  return {};
}

// Every sequence checked (check_sequence); the row holds the worst one's
// verdict, and its note says which sequence that is.
RunError check_ours(DecodeRun& run, TableRow& row) {
  const AttnProblem& p = run.dp.shape;  // Nq the new tokens, Nk the longest cache: the scratch's sizes
  size_t unfused_bytes = 0;             // the largest one-KV-head S of a sequence
  for (int len : run.lengths)
    if (len > 0) {
      AttnProblem sp = p;
      sp.B = 1, sp.Nk = len;
      unfused_bytes = std::max(unfused_bytes, unfused_workspace_granule(sp));
    }
  DeviceArena scratch;
  uint16_t* staging = nullptr;  // first: the baseline's workspace is left out where the rest takes the memory
  if (std::string e = scratch.alloc(size_t(p.Nk) * p.kv_heads() * std::max(p.D, p.Dv), &staging, "the gathered pages");
      !e.empty())
    return e;
  SequenceScratch sc;
  if (std::string e = allocate_sequence_scratch(scratch, p, unfused_bytes, &sc); !e.empty()) return e;

  int worst = -1;
  CheckResult worst_verdict;
  bool pass = true;
  for (int b = 0; b < p.B; ++b) {
    CheckResult verdict;
    if (RunError e = check_sequence(run, sc, staging, b, &verdict); e.failed()) return e;
    pass = pass && verdict.pass;
    if (worst < 0 || worse_verdict(verdict, worst_verdict)) worst = b, worst_verdict = verdict;
  }
  row.checked = true;
  row.pass = pass;
  row.err = worst_verdict.err;
  row.tol = worst_verdict.tol;
  row.lse_err = worst_verdict.lse_err;
  char where[128];
  std::snprintf(where, sizeof where, "; worst of %d sequences: #%d (%d keys)", p.B, worst,
                run.lengths[size_t(worst)]);
  row.check_note = worst_verdict.summary() + where;
  return {};
}

// Our row: run once into poisoned O and LSE, checked unless --no-check, its
// call queued for the timed rounds.
RunError add_our_row(DecodeRun& run) {
  TableRow r;
  r.name = kOursName;
  const AttnProblem& p = run.dp.shape;
  const size_t rows = size_t(p.B) * p.Nq * p.H;
  cudaError_t e = cudaMemsetAsync(run.bufs.o, 0xFF, rows * p.Dv * kInputElementBytes, run.stream);  // NaN
  if (e == cudaSuccess) e = cudaMemsetAsync(run.bufs.lse, 0xFF, rows * sizeof(float), run.stream);
  if (e != cudaSuccess) return cuda_error_text("poisoning O and LSE", e);
  r.error = launch_ours(run);
  if (r.error.empty())
    if (const cudaError_t sync = cudaStreamSynchronize(run.stream); sync != cudaSuccess)
      r.error = cudaGetErrorString(sync);
  std::function<std::string()> call;
  if (r.error.empty()) {
    if (run.opt.check)
      if (RunError err = check_ours(run, r); err.failed()) return err;
    read_first_values(run.bufs.o, int64_t(rows * p.Dv), p.dtype, r.first_values);
    call = [&run] { return launch_ours(run); };
  }
  run.rows.push_back(r);
  run.calls.push_back(call);
  run.row_bytes.push_back(run.kv_bytes + run.qo_bytes);
  return {};
}

// ==== the yardstick ===================================================================

// "copy (bandwidth)": a device-to-device cudaMemcpyAsync of 1 GiB, halved
// while two buffers of it would take more than half the free memory (at
// least 64 MiB); run once, timed with ours. Or a row saying why it cannot run.
void add_copy_row(DecodeRun& run) {
  TableRow r;
  r.name = kCopyName;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) free_bytes = 0;
  size_t bytes = kCopyBytes;
  while (bytes > kLeastCopyBytes && 2 * bytes > free_bytes / 2) bytes /= 2;
  uint8_t *src = nullptr, *dst = nullptr;
  std::function<std::string()> call;
  std::string why = run.copy_arena.alloc(bytes, &src, "the copy's source");
  if (why.empty()) why = run.copy_arena.alloc(bytes, &dst, "the copy's destination");
  if (!why.empty()) {
    r.status = "unsupported";
    r.note = why;
  } else {
    const cudaStream_t s = run.stream;
    call = [src, dst, bytes, s] {
      const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
      return err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(err));
    };
    // Both written once, so that their memory is mapped before the timed rounds.
    cudaError_t err = cudaMemsetAsync(src, 0x3C, bytes, s);
    if (err == cudaSuccess) err = cudaMemsetAsync(dst, 0, bytes, s);
    if (err == cudaSuccess) r.error = call();
    else r.error = cudaGetErrorString(err);
    if (r.error.empty())
      if (const cudaError_t sync = cudaStreamSynchronize(s); sync != cudaSuccess) r.error = cudaGetErrorString(sync);
    char note[128];
    std::snprintf(note, sizeof note, "cudaMemcpyAsync device to device: %.2f GiB read + %.2f GiB written",
                  gib(double(bytes)), gib(double(bytes)));
    r.note = note;
    if (!r.error.empty()) call = nullptr;
  }
  run.rows.push_back(r);
  run.calls.push_back(call);
  run.row_bytes.push_back(2.0 * double(bytes));
}

// ==== the report ======================================================================

void print_header(const DecodeRun& run) {
  const CommonOptions& opt = run.opt;
  const AttnProblem& p = run.dp.shape;
  char banner[512];
  std::snprintf(banner, sizeof banner, " %s, lengths %s, Warmup: %d, Iters: %d, Seed: %llu ",
                run.dp.shape_string().c_str(), lengths_summary(run).c_str(), opt.warmup, opt.iters,
                static_cast<unsigned long long>(run.seed));
  print_banner(banner);
  std::printf("%32s  %s; %d split%s over each sequence's keys (UNVERIFIED: this kernel has not run on a GPU before)\n",
              "paged_decode", describe_line(p.D).c_str(), run.splits, run.splits == 1 ? "" : "s");
  std::printf("%32s  %lld unmasked pairs per head over %d sequences (%lld keys in all); TFLOPS count "
              "2·(D+Dv)·pairs\n",
              "pairs", static_cast<long long>(run.pairs), p.B, static_cast<long long>(run.keys));
  std::printf("%32s  K and V %.3f GiB (every cache's L·Hkv·(D+Dv)·2 bytes) + q and O %.3f MiB; GB/s: these bytes / "
              "time, the copy's: its bytes read and written\n",
              "bytes", gib(run.kv_bytes), run.qo_bytes / double(1u << 20));
  if (opt.check)
    std::printf("%32s  sequence by sequence vs the fp32 reference on K, V gathered through the table; pass: err <= 2 x "
                "unfused err on the sequence + 2 x rounding, lse <= %.0e; the row: its worst sequence\n",
                "check", kLseTolerance);
}

// Each row's GB/s (0 where it did not run).
std::vector<double> rates(const DecodeRun& run) {
  std::vector<double> gbps(run.rows.size(), 0.0);
  for (size_t i = 0; i < run.rows.size(); ++i)
    if (run.rows[i].ran()) gbps[i] = run.row_bytes[i] / (run.rows[i].timing.median_ms * 1e-3) / 1e9;
  return gbps;
}

// The copy row's GB/s, 0 where it did not run.
double copy_rate(const DecodeRun& run, const std::vector<double>& gbps) {
  for (size_t i = 0; i < run.rows.size(); ++i)
    if (run.rows[i].name == kCopyName) return gbps[i];
  return 0;
}

// The rows, one line each: the table's (O[0], O[1], O[last]; the median time;
// TFLOPS) and, in place of gains and ratios to peers, GB/s and their share of
// the copy's; then the check (ours) or what was copied.
void print_rows(const DecodeRun& run, const std::vector<double>& gbps, double copy_gbps) {
  for (size_t i = 0; i < run.rows.size(); ++i) {
    const TableRow& r = run.rows[i];
    if (r.status == "unsupported" || r.status == "error") {
      std::printf("%32s: %s: %s\n", r.name.c_str(), r.status.c_str(), r.note.c_str());
      continue;
    }
    char values[64] = "";  // the copy has no output values
    const float* v = r.first_values;
    if (r.name == kOursName)
      std::snprintf(values, sizeof values, "['%-11.8f', '%-11.8f', '%-11.8f'],", v[0], v[1], v[2]);
    char tflops[32] = "-";
    if (r.tflops > 0) std::snprintf(tflops, sizeof tflops, "%.2f", r.tflops);
    char share[32] = "";
    if (copy_gbps > 0) std::snprintf(share, sizeof share, "%.1f%% of copy", 100.0 * gbps[i] / copy_gbps);
    std::printf("%32s: %-46s time:%.6fms, TFLOPS:%-7s GB/s:%-8.1f %-14s %s\n", r.name.c_str(), values,
                r.timing.median_ms, tflops, gbps[i], share, r.note.c_str());
  }
  std::printf("%s\n", std::string(kTableWidth, '-').c_str());
}

// The rows appended to --csv: the results columns (B the sequences, Nq the new
// tokens, Nk the longest cache), then lengths, page_size, bytes, gbps,
// copy_fraction, unverified.
std::string append_csv(const std::string& path, const SystemInfo& sys, const DecodeRun& run,
                       const std::vector<double>& gbps, double copy_gbps) {
  const std::string head = "," + csv_field(lengths_text(run)) + "," + std::to_string(run.dp.page_size) + ",";
  std::string lines;
  for (size_t i = 0; i < run.rows.size(); ++i) {
    const TableRow& r = run.rows[i];
    char tail[96] = ",,";  // gbps and copy_fraction: empty where the row did not run
    if (r.ran() && copy_gbps > 0) std::snprintf(tail, sizeof tail, "%.1f,%.3f", gbps[i], gbps[i] / copy_gbps);
    else if (r.ran()) std::snprintf(tail, sizeof tail, "%.1f,", gbps[i]);
    char bytes[32];
    std::snprintf(bytes, sizeof bytes, "%.0f", run.row_bytes[i]);
    lines += csv_row(sys, run.dp.shape, run.seed, r) + head + bytes + "," + tail + ",1\n";
  }
  return append_results_csv(path, lines, kDecodeCsvColumns);
}

int fail(const RunError& e) {
  std::fprintf(stderr, "flash_attn_mma: error: %s\n", e.message.c_str());
  return e.code;
}

}  // namespace

std::vector<int> decode_lengths(const DecodeOptions& d, uint64_t seed) {
  return draw_lengths(d.lengths, seed, kLengthSalt);
}

DecodeCacheShape decode_cache_shape(const std::vector<int>& lengths, int page_size) {
  DecodeCacheShape c;
  int64_t used = 0;
  for (int len : lengths) {
    const int64_t pages = (int64_t(len) + page_size - 1) / page_size;  // <= len: an int
    used += pages;
    c.max_pages = std::max(c.max_pages, int(pages));
  }
  c.num_pages = used + kDecodeSparePages;
  return c;
}

std::vector<int> decode_block_table(const std::vector<int>& lengths, int page_size, int max_pages, int num_pages,
                                    uint64_t seed) {
  // The cache's pages shuffled (Fisher-Yates on the seed's own stream, the
  // same order on every standard library); each sequence takes the next ones.
  std::vector<int> order(size_t(std::max(num_pages, 0)));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + kPageSalt);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(rng() % i)]);
  std::vector<int> table(lengths.size() * size_t(std::max(max_pages, 0)), -1);
  size_t next = 0;
  for (size_t b = 0; b < lengths.size(); ++b)  // pages past the table or the cache stay -1: tables_invalid says so
    for (int64_t j = 0; j * page_size < lengths[b] && j < max_pages && next < order.size(); ++j)
      table[b * size_t(max_pages) + size_t(j)] = order[next++];
  return table;
}

std::string decode_options_unsupported(const DecodeOptions& d) {
  if (!d.unverified) return "the paged-decoding kernel has not run on a GPU yet; pass --unverified to run it anyway";
  return "";
}

std::vector<ListEntry> decode_list() {
  std::string ours = paged_decode_describe();
  for (size_t at; (at = ours.find('\n')) != std::string::npos;) ours.replace(at, 1, at + 1 == ours.size() ? "" : "; ");
  return {{kOursName, "paged_decode", ours},
          {kCopyName, "",
           "cudaMemcpyAsync of 1 GiB device to device (less where it does not fit), timed with ours: the rate memory "
           "allows, the yardstick of the GB/s"}};
}

int run_decode_mode(const CommonOptions& opt, const DecodeOptions& d, const SystemInfo& sys, uint64_t seed,
                    cudaStream_t stream) {
  DecodeRun run(opt, d, seed, stream);
  if (RunError e = set_up(run); e.failed()) return fail(e);
  print_header(run);
  // The rows: ours, run once and checked, then the copy.
  if (RunError e = add_our_row(run); e.failed()) return fail(e);
  bool device_lost = cudaDeviceSynchronize() != cudaSuccess;
  if (!device_lost) add_copy_row(run);
  device_lost = device_lost || cudaDeviceSynchronize() != cudaSuccess;
  if (!device_lost)
    device_lost = time_rows(run.rows, run.calls, opt.warmup, opt.iters, run.flush, run.flush_bytes, stream);
  const TableScore score = score_rows(run.rows, run.flops);
  for (TableRow& r : run.rows)
    if (r.name == kCopyName) r.tflops = 0;  // a copy does no attention: its TFLOPS would be ours over its time
  const std::vector<double> gbps = rates(run);
  const double copy_gbps = copy_rate(run, gbps);
  print_rows(run, gbps, copy_gbps);
  std::printf("%s | driver %s | CUDA %s | torch %s | attnlab %s | %s\n", sys.gpu.c_str(), sys.driver.c_str(),
              sys.cuda.c_str(), torch_version().c_str(), sys.commit.c_str(), sys.date.c_str());
  if (!opt.csv.empty())
    if (std::string e = append_csv(opt.csv, sys, run, gbps, copy_gbps); !e.empty()) return fail(RunError(e));
  if (device_lost) return fail(RunError("the GPU reported a fatal error; later rows were not run"));
  if (score.failures > 0) {
    std::fprintf(stderr, "flash_attn_mma: %d row%s failed\n", score.failures, score.failures > 1 ? "s" : "");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace attnlab
