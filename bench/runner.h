// attnlab: the harness's runner — timing variants, the results CSV, the lines
// of a failed run. Running a variant once and checking it is
// reference/checked_run.h (the GPU tests use it too).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "host/attn_problem.h"
#include "host/variant.h"
#include "reference/checked_run.h"

namespace attnlab {

// An error that ends the run: one line for stderr and the process exit code.
// Built from a function's "" (no error) or its message.
struct RunError {
  std::string message;
  int code = kExitFailed;
  RunError() = default;
  RunError(std::string m, int c = kExitFailed) : message(std::move(m)), code(c) {}
  bool failed() const { return !message.empty(); }
};

// Device allocations freed on scope exit.
struct DeviceArena {
  std::vector<void*> ptrs;
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  std::string alloc(size_t count, T** out, const char* what) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16)) != cudaSuccess) {
      cudaGetLastError();
      char buf[128];
      std::snprintf(buf, sizeof buf, "out of GPU memory allocating %.2f GiB for %s", double(count * sizeof(T)) / (1 << 30),
                    what);
      return buf;
    }
    ptrs.push_back(p);
    *out = static_cast<T*>(p);
    return "";
  }
};

struct Timing {
  double median_ms = 0, min_ms = 0;
};
// `warmup` untimed calls of `call` (which enqueues work on `stream` and returns
// "" or a one-line error), then `iters` calls, each after an L2 flush (a write
// of `flush_bytes` to `flush`) and a queued GPU delay (host/gpu_delay.h: the
// call's host-side dispatch happens under it), between two CUDA events; the
// median is what gets reported.
std::string time_calls(const std::function<std::string()>& call, int warmup, int iters, void* flush,
                       size_t flush_bytes, cudaStream_t stream, Timing* out);
// time_calls of several calls at once, interleaved (time_calls is this with
// one call): each is warmed up, then round r times call 0, 1, 2, ... once each,
// so that every call's iterations spread over the same stretch of time and
// meet the same clocks (the card's clock follows its power limit: timed one
// after another, the last rows of a shape ran up to 6 % slower). errors[i] is
// call i's first error ("" if none); a failed call is left out of the later
// rounds.
void time_calls_interleaved(const std::vector<std::function<std::string()>>& calls, int warmup, int iters,
                            void* flush, size_t flush_bytes, cudaStream_t stream, std::vector<Timing>* out,
                            std::vector<std::string>* errors);
// A variant's launch (launch_timed where it has one) on buffers `b` (a
// ProblemBuffers' attn() or a GradBuffers' grad()) as a call for the timers.
template <typename Buffers>
std::function<std::string()> variant_call(const VariantOf<Buffers>& v, const AttnProblem& p, const Buffers& b,
                                          cudaStream_t stream);

// "" when rows can be appended to the results CSV at `path`, else one line
// saying why not ("cannot write --csv /no/such/dir/x.csv: No such file or
// directory"; a file whose header is not these rows' columns). Opens the file
// for appending and closes it again, removing it when it did not exist
// before; the harness asks before anything runs. `extra_columns`: columns
// after the schema's, e.g. ",mask,score" (the block-sparse rows').
std::string results_csv_error(const std::string& path, const std::string& extra_columns = "");
// Appends `rows` (CSV lines, each ending in '\n') to the results CSV at
// `path`, after the header row (the schema docs/results.md describes, then
// `extra_columns`) when the file is new or empty. Returns "" or one line
// saying what was lost.
std::string append_results_csv(const std::string& path, const std::string& rows,
                               const std::string& extra_columns = "");

// A CSV field: commas, quotes and newlines become ';'.
std::string csv_field(std::string s);

// The line of exit 3 when `what` failed with `err` (cudaSuccess: no device was
// found): what is missing, plainly, then CUDA's own words. driver_version and
// runtime_version are cudaDriverGetVersion's (0: no driver) and
// cudaRuntimeGetVersion's, e.g. 12040; CUDA's words for a missing driver,
// "driver version is insufficient", would suggest an upgrade.
std::string no_gpu_text(const char* what, cudaError_t err, int driver_version, int runtime_version);

}  // namespace attnlab
