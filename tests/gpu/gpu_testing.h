// attnlab: what the GPU test programs share — the pass/fail tally, 16-bit
// values that are exact on both sides (bits for the device, values for the CPU
// reference), an output held against its references, scoped device memory, uploads, and the dynamic-mask test case (shape, mask and bias
// broadcast forms) with its inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "host/attn_problem.h"
#include "reference/reference.h"

namespace attnlab::testing {

inline int passed = 0, failed = 0;

inline void record(bool ok, const std::string& what) {
  if (ok) ++passed;
  else {
    ++failed;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// The exit code of a test program that had no GPU to test on: ctest counts it
// as skipped (SKIP_RETURN_CODE in CMakeLists.txt), not failed.
constexpr int kSkipped = 77;

// True when there is a CUDA GPU to test on; otherwise false after one line
// with CUDA's own words. Every main starts with
//   if (!have_gpu()) return kSkipped;
inline bool have_gpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return true;
  std::printf("skipped: no usable CUDA GPU (%s)\n",
              err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found no device");
  return false;
}

// A case-list test's options: -v (one line per case, printed as it finishes,
// and the case's name before its launch, so a hang names its case) and
// --only TEXT (only the cases whose name contains TEXT: the sanitizers' subset).
struct CaseArgs {
  bool verbose = false;
  std::string only;
  bool wanted(const std::string& name) const { return only.empty() || name.find(only) != std::string::npos; }
  void starting(const std::string& name) const {
    if (!verbose) return;
    std::printf("run  %s\n", name.c_str());
    std::fflush(stdout);
  }
};
// Runs run_case(case, rng) on each case of `cases` that `args` wants, in
// order, each with its own generator seeded by seed + its place in the list
// (so a case's inputs do not depend on which cases ran before it); false as
// soon as run_case says the GPU is no longer usable.
template <typename Case, typename Run>
bool run_cases(const CaseArgs& args, const std::vector<Case>& cases, uint64_t seed, Run&& run_case) {
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!args.wanted(cases[i].name())) continue;
    std::mt19937_64 rng(seed + i);
    args.starting(cases[i].name());
    if (!run_case(cases[i], rng)) return false;
  }
  return true;
}

inline CaseArgs parse_case_args(int argc, char** argv) {
  CaseArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-v") a.verbose = true;
    else if (arg == "--only" && i + 1 < argc) a.only = argv[++i];
    else {
      std::printf("usage: %s [-v] [--only TEXT]\n", argv[0]);
      std::exit(2);
    }
  }
  return a;
}

// Prints the tally and returns the exit code: 0 when something passed and nothing failed.
inline int finish() {
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}

// After a launch that returned `launch_error` ("" when it ran): false, with the
// tally so far, when the error left the GPU unusable (a sticky error), so that
// the caller stops instead of failing every later case on a dead context.
inline bool gpu_still_usable(const std::string& launch_error) {
  if (launch_error.empty() || cudaDeviceSynchronize() == cudaSuccess) return true;
  std::printf("fatal GPU error, stopping\n%d passed, %d failed\n", passed, failed);
  return false;
}

inline uint16_t to_bits(double x, DType t) {
  if (t == DType::kFloat16) return __half_raw(__float2half_rn(float(x))).x;
  return __nv_bfloat16_raw(__float2bfloat16_rn(float(x))).x;
}
inline double from_bits(uint16_t b, DType t) {
  if (t == DType::kFloat16) return __half2float(__half(__half_raw{b}));
  return __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{b}));
}

// x rounded to the dtype (round to nearest even).
inline double round_to(double x, DType t) { return from_bits(to_bits(x, t), t); }

// A 16-bit output (bits) against its double reference and the same-precision
// path's values (low), elementwise, as the check rule (reference.h, judge)
// takes them: the output's error (non-finite values counted), the
// same-precision error, and the reference's rounding to the dtype measured as
// output_rounding_error does on the GPU (in fp32).
struct OutputComparison {
  ErrorStats stats;
  double baseline_err = 0, rounding_err = 0;
};
inline OutputComparison compare_output(const std::vector<uint16_t>& bits, const std::vector<double>& ref,
                                       const std::vector<double>& low, DType t) {
  OutputComparison c;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = from_bits(bits[i], t);
    if (!std::isfinite(got)) ++c.stats.nonfinite;
    else c.stats.max_abs_err = std::max(c.stats.max_abs_err, std::fabs(got - ref[i]));
    c.baseline_err = std::max(c.baseline_err, std::fabs(low[i] - ref[i]));
    const float rf = float(ref[i]);
    c.rounding_err = std::max(c.rounding_err, double(std::fabs(float(round_to(rf + 0.3f, t)) - 0.3f - rf)));
  }
  return c;
}

// Device memory freed on every path out of a test case.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  template <typename T>
  T* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) return nullptr;
    ptrs.push_back(p);
    return static_cast<T*>(p);
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
};

// n normal values (standard deviation sd) rounded to the dtype: `bits` for the
// GPU, the very same numbers in `vals` for the CPU reference.
inline void random_tensor(std::mt19937_64& rng, int64_t n, DType t, double sd, std::vector<uint16_t>& bits,
                          std::vector<double>& vals) {
  std::normal_distribution<double> dist(0.0, sd);
  bits.resize(size_t(n));
  vals.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    bits[size_t(i)] = to_bits(dist(rng), t);
    vals[size_t(i)] = from_bits(bits[size_t(i)], t);
  }
}

// A device copy of `host` (at least one element allocated); nullptr when out of memory.
template <typename T>
T* upload(const std::vector<T>& host) {
  T* dev = nullptr;
  if (cudaMalloc(&dev, std::max<size_t>(1, host.size()) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return dev;
}

}  // namespace attnlab::testing
