#include "runner.h"

#include "host/gpu_delay.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace attnlab {

std::string no_gpu_text(const char* what, cudaError_t err, int driver_version, int runtime_version) {
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string cuda = err == cudaSuccess ? std::string(what) + " found no device" : cuda_error_text(what, err);
  std::string plainly = "no usable NVIDIA GPU";
  if (driver_version == 0)
    plainly = "no NVIDIA driver found, so no GPU to run on";
  else if (err == cudaErrorInsufficientDriver)
    plainly = "the NVIDIA driver runs CUDA " + version(driver_version) + " at most, older than this build's CUDA " +
              version(runtime_version) + " runtime: update the driver";
  else if (err == cudaSuccess || err == cudaErrorNoDevice)
    plainly = "no NVIDIA GPU found (the driver is there, CUDA " + version(driver_version) + ")";
  return plainly + " (CUDA: " + cuda + ")";
}

// The GPU's wait before each timed call (host/gpu_delay.h): longer than a
// call's host-side dispatch, so that the events see GPU time only.
constexpr unsigned kTimerDelayUs = 300;

template <typename Buffers>
std::function<std::string()> variant_call(const VariantOf<Buffers>& v, const AttnProblem& p, const Buffers& b,
                                          cudaStream_t stream) {
  const auto* launch = v.launch_timed ? &v.launch_timed : &v.launch;  // v and p outlive the call
  return [&v, &p, launch, b, stream]() -> std::string {
    const cudaError_t e = (*launch)(p, b, stream);
    return e == cudaSuccess ? "" : launch_error_text(v, e);
  };
}
template std::function<std::string()> variant_call(const VariantOf<AttnBuffers>&, const AttnProblem&,
                                                   const AttnBuffers&, cudaStream_t);
template std::function<std::string()> variant_call(const VariantOf<AttnGradBuffers>&, const AttnProblem&,
                                                   const AttnGradBuffers&, cudaStream_t);

void time_calls_interleaved(const std::vector<std::function<std::string()>>& calls, int warmup, int iters,
                            void* flush, size_t flush_bytes, cudaStream_t stream, std::vector<Timing>* out,
                            std::vector<std::string>* errors) {
  const size_t n = calls.size();
  out->assign(n, Timing{});
  errors->assign(n, "");
  for (size_t c = 0; c < n; ++c)
    for (int i = 0; i < warmup && (*errors)[c].empty(); ++i) (*errors)[c] = calls[c]();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<std::vector<float>> ms(n);
  for (int i = 0; i < iters; ++i) {
    for (size_t c = 0; c < n; ++c) {
      if (!(*errors)[c].empty()) continue;
      cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream);  // evict L2 (not timed)
      enqueue_gpu_delay(stream, kTimerDelayUs);
      cudaEventRecord(start, stream);
      std::string err = calls[c]();
      cudaEventRecord(stop, stream);
      float t = 0.f;
      if (err.empty()) {
        cudaError_t e = cudaEventSynchronize(stop);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&t, start, stop);
        if (e != cudaSuccess) err = cuda_error_text("timing", e);
      }
      if (err.empty()) ms[c].push_back(t);
      else (*errors)[c] = err;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (size_t c = 0; c < n; ++c) {
    std::vector<float>& m = ms[c];
    if (!(*errors)[c].empty() || m.empty()) continue;
    std::sort(m.begin(), m.end());
    const size_t k = m.size();
    (*out)[c].median_ms = k % 2 ? m[k / 2] : 0.5 * (double(m[k / 2 - 1]) + m[k / 2]);
    (*out)[c].min_ms = m.front();
  }
}

std::string time_calls(const std::function<std::string()>& call, int warmup, int iters, void* flush,
                       size_t flush_bytes, cudaStream_t stream, Timing* out) {
  std::vector<Timing> timing;
  std::vector<std::string> error;
  time_calls_interleaved({call}, warmup, iters, flush, flush_bytes, stream, &timing, &error);
  *out = timing[0];
  return error[0];
}

namespace {
const char kResultsCsvColumns[] =
    "gpu,driver,cuda,commit,date,variant,kind,B,H,Nq,Nk,D,Dv,dtype,causal,time_ms,tflops,ratio_to_best_peer,"
    "status,max_err,tol,lse_err,seed,note";
}  // namespace

std::string results_csv_error(const std::string& path, const std::string& extra_columns) {
  struct stat st;
  const bool existed = stat(path.c_str(), &st) == 0;
  if (existed && S_ISDIR(st.st_mode)) return "cannot write --csv " + path + ": it is a directory";
  if (existed && S_ISREG(st.st_mode) && st.st_size > 0) {  // rows go under the same columns only
    std::ifstream f(path);
    std::string header;
    std::getline(f, header);
    if (!header.empty() && header.back() == '\r') header.pop_back();
    const std::string want = kResultsCsvColumns + extra_columns;
    if (f && header != want)
      return "cannot write --csv " + path + ": its columns are not these rows' (" +
             (extra_columns.empty() ? "the results schema" : "the results schema and " + extra_columns.substr(1)) +
             "); use another file";
  }
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return "cannot write --csv " + path + ": " + std::strerror(errno);
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return "";
}

std::string append_results_csv(const std::string& path, const std::string& rows, const std::string& extra_columns) {
  std::ifstream existing(path);
  const bool need_header = !existing.good() || existing.peek() == std::ifstream::traits_type::eof();
  existing.close();
  const std::string text = need_header ? kResultsCsvColumns + extra_columns + "\n" + rows : rows;
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return "cannot write --csv " + path + ": " + std::strerror(errno) + "; its rows are lost";
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed)
    return "writing --csv " + path + " failed: " + std::strerror(written ? errno : write_errno) +
           "; its rows are lost";
  return "";
}

std::string csv_field(std::string s) {
  for (char& c : s)
    if (c == ',' || c == '\n' || c == '"') c = ';';
  return s;
}

}  // namespace attnlab
