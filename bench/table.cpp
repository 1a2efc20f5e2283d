#include "table.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace attnlab {

void set_outcome(TableRow& r, const RunOutcome& out) {
  r.error = out.error;
  std::copy(out.first_values, out.first_values + 3, r.first_values);
  if (!out.checked) return;
  r.checked = true;
  r.pass = out.check.pass;
  r.err = out.check.err;
  r.tol = out.check.tol;
  r.lse_err = out.check.lse_err;
  r.check_note = out.check.summary();
}

bool time_rows(std::vector<TableRow>& rows, const std::vector<std::function<std::string()>>& calls, int warmup,
               int iters, void* flush, size_t flush_bytes, cudaStream_t stream) {
  std::vector<std::function<std::string()>> timed_calls;
  std::vector<size_t> timed;  // the rows behind timed_calls
  for (size_t i = 0; i < rows.size() && i < calls.size(); ++i)
    if (calls[i]) {
      timed_calls.push_back(calls[i]);
      timed.push_back(i);
    }
  if (timed.empty()) return false;
  std::vector<Timing> timings;
  std::vector<std::string> errors;
  time_calls_interleaved(timed_calls, warmup, iters, flush, flush_bytes, stream, &timings, &errors);
  for (size_t c = 0; c < timed.size(); ++c) {
    rows[timed[c]].timing = timings[c];
    rows[timed[c]].error = errors[c];
  }
  return cudaDeviceSynchronize() != cudaSuccess;
}

TableScore score_rows(std::vector<TableRow>& rows, double flops) {
  TableScore score;
  double best = 0;
  for (TableRow& r : rows) {
    if (!r.status.empty()) continue;  // unsupported: nothing ran
    if (!r.error.empty() || !r.ran()) {
      r.status = "error";
      r.note = r.error.empty() ? "not timed (the device failed)" : r.error;
      r.timing = Timing{};
      score.failures += r.is_peer ? 0 : 1;  // a peer that cannot run is reported, not failed
      continue;
    }
    r.tflops = flops / (r.timing.median_ms * 1e-3) / 1e12;
    if (r.tflops > best) {
      r.gain_pct = best > 0 ? (r.tflops / best - 1.0) * 100.0 : 0.0;
      best = r.tflops;
    }
    if (r.checked && r.is_baseline) {
      r.status = "baseline";
      r.note = r.check_note;
    } else if (r.checked) {
      r.status = r.pass ? "PASS" : "FAIL";
      r.note = r.check_note;
      score.failures += (r.pass || r.is_peer) ? 0 : 1;
    } else {
      r.status = "unchecked";
    }
    if (r.is_peer && r.status != "FAIL" && r.tflops > score.best_peer_tflops) {
      score.best_peer_tflops = r.tflops;
      score.best_peer_name = r.name;
    }
    if (!r.is_peer && score.best_peer_tflops > 0) r.ratio_to_best_peer = r.tflops / score.best_peer_tflops;
  }
  return score;
}

namespace {
void print_row(const TableRow& r, const std::string& best_peer_name) {
  const char* name = r.name.c_str();
  if (r.status == "unsupported" || r.status == "error") {
    std::printf("%32s: %s: %s\n", name, r.status.c_str(), r.note.c_str());
    return;
  }
  const float* v = r.first_values;
  char gain[32] = "";
  if (r.gain_pct >= 0) std::snprintf(gain, sizeof gain, "(+%.2f%%)", r.gain_pct);
  char ratio[64] = "";
  if (r.ratio_to_best_peer > 0)
    std::snprintf(ratio, sizeof ratio, "%.2fx %s", r.ratio_to_best_peer, best_peer_name.c_str());
  std::printf("%32s: ['%-11.8f', '%-11.8f', '%-11.8f'], time:%.6fms, TFLOPS:%-7.2f%-10s %-22s %s\n", name, v[0], v[1],
              v[2], r.timing.median_ms, r.tflops, gain, ratio, r.checked ? r.note.c_str() : "");
}
}  // namespace

void print_table(const std::vector<TableRow>& rows, const std::string& best_peer_name, bool show_all) {
  int hidden = 0;
  for (const TableRow& r : rows) {
    const bool interesting = r.status == "FAIL" || r.status == "error" || r.status == "unsupported" || r.gain_pct >= 0;
    if (show_all || interesting) print_row(r, best_peer_name);
    else ++hidden;
  }
  std::printf("%s\n", std::string(kTableWidth, '-').c_str());
  if (hidden > 0)
    std::printf("(%d row%s hidden: slower than the best so far; --show-all shows them)\n", hidden,
                hidden > 1 ? "s" : "");
}

std::string faster_or_slower(double ratio) {
  char text[48];
  if (!(ratio > 0)) return "not compared (no time)";
  if (ratio >= 1) std::snprintf(text, sizeof text, "%.2fx faster", ratio);
  else std::snprintf(text, sizeof text, "%.2fx slower", 1 / ratio);
  return text;
}

void print_banner(const std::string& text) {
  const int len = int(text.size()), pad = std::max(0, kTableWidth - len) / 2;
  std::printf("%s%s%s\n", std::string(size_t(pad), '-').c_str(), text.c_str(),
              std::string(size_t(std::max(0, kTableWidth - pad - len)), '-').c_str());
}

std::string csv_row(const SystemInfo& sys, const AttnProblem& p, uint64_t seed, const TableRow& r) {
  // The CSV has no Hkv column: a GQA row says it in its note, as the dynamic-mask rows do.
  const std::string kv_note = p.gqa() ? "Hkv=" + std::to_string(p.kv_heads()) + "; " : "";
  char nums[96] = ",,";
  if (r.ran()) {
    if (r.ratio_to_best_peer > 0)
      std::snprintf(nums, sizeof nums, "%.6f,%.2f,%.3f", r.timing.median_ms, r.tflops, r.ratio_to_best_peer);
    else
      std::snprintf(nums, sizeof nums, "%.6f,%.2f,", r.timing.median_ms, r.tflops);
  }
  char errs[96] = ",,";
  if (r.checked && r.lse_err >= 0) std::snprintf(errs, sizeof errs, "%.3e,%.3e,%.3e", r.err, r.tol, r.lse_err);
  else if (r.checked) std::snprintf(errs, sizeof errs, "%.3e,%.3e,", r.err, r.tol);
  std::ostringstream f;
  f << csv_field(sys.gpu) << ',' << csv_field(sys.driver) << ',' << csv_field(sys.cuda) << ',' << sys.commit << ','
    << sys.date << ',' << csv_field(r.name) << ',' << (r.is_peer ? "peer" : "rung") << ',' << p.B << ',' << p.H
    << ',' << p.Nq << ',' << p.Nk << ',' << p.D << ',' << p.Dv << ',' << dtype_name(p.dtype) << ','
    << (p.causal ? 1 : 0) << ',' << nums << ',' << r.status << ',' << errs << ',' << seed << ','
    << csv_field(kv_note + r.note);
  return f.str();
}

std::string append_rows_csv(const std::string& path, const SystemInfo& sys, const AttnProblem& p, uint64_t seed,
                            const std::vector<TableRow>& rows) {
  std::string lines;
  for (const TableRow& r : rows) lines += csv_row(sys, p, seed, r) + '\n';
  return append_results_csv(path, lines);
}

void print_list(const std::vector<ListEntry>& entries) {
  size_t name_width = 0, rung_width = 0;
  for (const ListEntry& e : entries) {
    name_width = std::max(name_width, e.name.size());
    rung_width = std::max(rung_width, e.rung.size());
  }
  for (const ListEntry& e : entries)
    std::printf("%-*s  %-*s  %s\n", int(name_width), e.name.c_str(), int(rung_width), e.rung.c_str(), e.about.c_str());
}

}  // namespace attnlab
