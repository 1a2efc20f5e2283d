// attnlab: flash_attn_mma's table of rows, shared by the forward and the dense
// backward: one row per variant, the peers first, then the rungs in ladder
// order; each with its check, median time, TFLOPS, gain over the best row so
// far and ratio to the best peer; printed one line per row and appended to
// --csv (the columns of docs/results.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "host/attn_problem.h"
#include "runner.h"
#include "system_info.h"

namespace attnlab {

constexpr int kTableWidth = 150;

struct TableRow {
  std::string name;            // as printed and written: "split-q+stage2", "sdpa(flash) bwd"
  bool is_peer = false;
  bool is_baseline = false;    // the check's yardstick (the forward's `unfused`): reported, not judged
  std::string status;          // "" until score_rows, except for rows that did not run: "unsupported"
  std::string note;            // the check's summary, the unsupported reason or the error
  std::string error;           // the row's launch or timing error ("" when it ran)
  bool checked = false;        // pass, check_note and the errors below hold a verdict
  bool pass = false;
  std::string check_note;      // "PASS err 9.8e-04 <= 2.4e-03, lse 2.1e-06"
  double err = 0, tol = 0;     // for the CSV: the error and the bound it is held to
  double lse_err = -1;         // the LSE error (< 0: none, as for a backward row)
  float first_values[3] = {0, 0, 0};
  Timing timing;
  double tflops = 0;
  double gain_pct = -1;           // over the best row so far; < 0 when not an improvement
  double ratio_to_best_peer = 0;  // rungs only; 0 when no peer ran
  bool ran() const { return timing.median_ms > 0; }
};

// A forward row's result of run_and_check: its error, first values and, when
// checked, its verdict (check_note the check's summary).
void set_outcome(TableRow& r, const RunOutcome& out);

struct TableScore {
  std::string best_peer_name;
  double best_peer_tflops = 0;
  int failures = 0;  // rungs that failed their check or could not run (peers are reported, not failed)
};

// Times together, interleaved (time_calls_interleaved), the rows whose call
// is set (calls[i] for rows[i]); a row whose timed calls failed gets the
// error. Returns true when the device was lost (a sticky error).
bool time_rows(std::vector<TableRow>& rows, const std::vector<std::function<std::string()>>& calls, int warmup,
               int iters, void* flush, size_t flush_bytes, cudaStream_t stream);

// Each row's status (error, baseline, PASS / FAIL, unchecked), TFLOPS
// (`flops` / median time), gain and ratio to the best peer that did not FAIL,
// in order: the peers come first, so the best peer is known at the rungs.
TableScore score_rows(std::vector<TableRow>& rows, double flops);

// The rows (with show_all every one, else the failures, the unsupported rows
// and those that beat the best so far), the closing rule, and a line saying
// how many were hidden.
void print_table(const std::vector<TableRow>& rows, const std::string& best_peer_name, bool show_all);

// A line of kTableWidth with `text` in its middle, between dashes.
void print_banner(const std::string& text);

// How a row compares with another, from `ratio` = the other's time / this
// row's: "1.12x faster", or below 1 "2.17x slower" (never "0.46x faster").
std::string faster_or_slower(double ratio);

// One row as a line of the results CSV (docs/results.md's columns), without its '\n'.
std::string csv_row(const SystemInfo& sys, const AttnProblem& p, uint64_t seed, const TableRow& r);
// Appends the rows to the results CSV at `path`; returns "" or what was lost.
std::string append_rows_csv(const std::string& path, const SystemInfo& sys, const AttnProblem& p, uint64_t seed,
                            const std::vector<TableRow>& rows);

// --list: one line per entry (name, rung, description), the columns padded.
struct ListEntry {
  std::string name, rung, about;
};
void print_list(const std::vector<ListEntry>& entries);

}  // namespace attnlab
