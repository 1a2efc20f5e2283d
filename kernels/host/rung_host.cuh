// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: host-side plumbing shared by the rungs — head-dim and dtype dispatch,
// the support checks every rung makes, and the `--list` description.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "host/attn_problem.h"
#include "host/device.h"
#include "host/env_switch.h"
#include "host/launch.h"
#include "host/variant.h"

namespace attnlab {

// A (D, Dv) pair of head dims, as a type (for HeadDimList).
template <int D_, int Dv_>
struct HeadDims {
  static constexpr int D = D_, Dv = Dv_;
};
// The (D, Dv) pairs a rung runs, in the order --list prints them: how a rung
// picks the config of exact head dims.
template <typename... Pairs>
struct HeadDimList {
  // Calls f(Pairs{}) for the pair equal to (D, Dv); false when there is none.
  template <typename F>
  static bool dispatch(int D, int Dv, F&& f) {
    return ((D == Pairs::D && Dv == Pairs::Dv ? (f(Pairs{}), true) : false) || ...);
  }
  // Calls f(Pairs{}) for every pair, in order.
  template <typename F>
  static void for_each(F&& f) {
    (f(Pairs{}), ...);
  }
  static std::string names() {
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(Pairs::D) +
           (Pairs::Dv == Pairs::D ? std::string() : "/" + std::to_string(Pairs::Dv))),
     ...);
    return "{" + s + "}";
  }
  // The reason a variant of these pairs prints for head dims (D, Dv) that are not one of them.
  static std::string not_in(int D, int Dv) {
    return "head dims " + std::to_string(D) + (Dv == D ? "" : "/" + std::to_string(Dv)) + " not in " + names() +
           " (D, or D/Dv)";
  }
};

// A rung's head dims where Dv must equal D: the pairs (D, D) of kHeadDims.
template <int... kHeadDims>
using EqualHeadDims = HeadDimList<HeadDims<kHeadDims, kHeadDims>...>;

// Calls f(std::integral_constant<int, B>{}) for the smallest bucket B in
// kBuckets (ascending) with d <= B; false when d exceeds every bucket. Not a
// head-dim list: a bucket's config runs every D up to it (rungs 05 and 06,
// bucket_launch below), where HeadDimList matches exact head dims.
template <int... kBuckets, typename F>
bool dispatch_bucket(int d, F&& f) {
  return ((d <= kBuckets ? (f(std::integral_constant<int, kBuckets>{}), true) : false) || ...);
}

// Calls f(half{}) or f(__nv_bfloat16{}).
template <typename F>
cudaError_t dispatch_dtype(DType t, F&& f) {
  return t == DType::kFloat16 ? f(half{}) : f(__nv_bfloat16{});
}

// "" when a block of `smem_bytes` dynamic shared memory fits the device's
// opt-in limit (or there is no device to ask), else the reason.
inline std::string smem_unsupported(size_t smem_bytes) {
  const size_t limit = device_smem_optin_bytes();
  if (limit != 0 && smem_bytes > limit)
    return "needs " + std::to_string(smem_bytes) + " B shared memory, device allows " + std::to_string(limit);
  return "";
}

// "" when the problem's KV heads are a valid grouping of its query heads
// (GQA/MQA: H a multiple of Hkv, which every rung takes), else the reason.
inline std::string kv_heads_unsupported(const AttnProblem& p) {
  if (p.kv_heads() < 1 || p.H % p.kv_heads() != 0) return "H must be a multiple of Hkv";
  return "";
}

// The reasons every rung shares for not running a problem ("" = runs).
inline std::string common_unsupported(const AttnProblem& p, bool head_dim_ok, const std::string& head_dims,
                                      size_t smem_bytes) {
  if (p.Dv != p.D) return "needs Dv == D";
  if (!head_dim_ok) return "head dim " + std::to_string(p.D) + " not in " + head_dims;
  if (p.H > 65535 || p.B > 65535) return "B and H must be <= 65535 (grid limits)";
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  return smem_unsupported(smem_bytes);
}

// Sets the kernel's dynamic shared-memory limit and launches it (launch_kernel:
// the status of this launch alone).
template <typename Kernel, typename... Args>
cudaError_t launch_with_smem(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                             Args... args) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  return launch_kernel(kernel, grid, dim3(threads), size_t(smem_bytes), stream, args...);
}

// launch_with_smem with at most one launch attribute (nullptr: none), through
// cudaLaunchKernelEx: the one place that fills a cudaLaunchConfig_t.
template <typename Kernel, typename... Args>
cudaError_t launch_with_attribute(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                                  const cudaLaunchAttribute* attribute, Args... args) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute copy{};
  if (attribute != nullptr) copy = *attribute;
  config.attrs = &copy;
  config.numAttrs = attribute != nullptr ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);  // this launch's own status (host/launch.h)
}

// launch_with_smem, but on sm_90 with programmatic stream serialization: the
// kernel may start while the previous kernel in the stream drains, so its
// launch and block setup overlap that kernel's tail. The kernel MUST call
// griddep_wait() (ptx.cuh) before it touches any memory the previous work may
// write or read. Elsewhere an ordinary launch.
template <typename Kernel, typename... Args>
cudaError_t launch_with_smem_overlapped(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                                        Args... args) {
  // ATTNLAB_NO_PDL=1 turns the overlap off (ordinary launches), to measure
  // what it buys or to rule it out while debugging.
  static const bool disabled = env_switch_on("ATTNLAB_NO_PDL");
  if (disabled || !device_is_sm90_or_newer())
    return launch_with_smem(kernel, grid, threads, smem_bytes, stream, args...);
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  return launch_with_attribute(kernel, grid, threads, smem_bytes, stream, &overlap, args...);
}

// Launches `kernel` on `grid` in clusters of `cluster_x` blocks along x (1:
// no cluster attribute), with `smem_bytes` of dynamic shared memory.
template <typename Kernel, typename... Args>
inline cudaError_t launch_clustered(Kernel kernel, dim3 grid, int threads, int smem_bytes, int cluster_x,
                                    cudaStream_t stream, Args... args) {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cluster_x;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  return launch_with_attribute(kernel, grid, threads, smem_bytes, stream, cluster_x > 1 ? &cluster : nullptr,
                               args...);
}

// Launches the kernel of one config on the problem's dtype: a grid of
// (ceil(Nq / Br), H, B) blocks of Cfg::kThreads threads with Cfg::kSmemBytes of
// dynamic shared memory, the kernel taking (q, k, v, o, lse, problem).
// kernel_for(Cfg{}, T{}) names the kernel instantiation.
template <typename Cfg, typename KernelFor>
cudaError_t launch_config(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream, KernelFor kernel_for) {
  return dispatch_dtype(p.dtype, [&](auto type) {
    using T = decltype(type);
    const dim3 grid((p.Nq + Cfg::kBr - 1) / Cfg::kBr, p.H, p.B);
    return launch_with_smem(kernel_for(Cfg{}, type), grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                            static_cast<const T*>(b.q), static_cast<const T*>(b.k), static_cast<const T*>(b.v),
                            static_cast<T*>(b.o), b.lse, p);
  });
}

}  // namespace attnlab

namespace attnlab {

// `unsupported_reason` and `describe` of a rung whose configs are
// Config<D, kStages> with kBr, kBc, kWarps and kSmemBytes, for the head dims
// of `HeadDimsList` (an EqualHeadDims).
template <template <int, int> class Config, int kStages, typename HeadDimsList>
std::string rung_unsupported(const AttnProblem& p) {
  int smem = 0;
  const bool ok = HeadDimsList::dispatch(
      p.D, p.Dv, [&](auto dims) { smem = Config<decltype(dims)::D, kStages>::kSmemBytes; });
  return common_unsupported(p, ok, HeadDimsList::names(), size_t(smem));
}

template <template <int, int> class Config, int kStages, typename HeadDimsList>
std::string rung_describe() {
  std::string s = "stages=" + std::to_string(kStages);
  HeadDimsList::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D;
    using Cfg = Config<D, kStages>;
    s += "; D=" + std::to_string(D) + ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
         " warps=" + std::to_string(Cfg::kWarps) + " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
  });
  return s + "; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
}

}  // namespace attnlab

namespace attnlab {

// The same for a rung whose configs come in head-dim buckets (Config<kBucket,
// kStages>, a problem running in the smallest bucket >= D), for every D that is
// a multiple of 8 up to the largest bucket.
template <template <int, int> class Config, int kStages, int... kBuckets, typename KernelFor>
cudaError_t bucket_launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream, KernelFor kernel_for) {
  cudaError_t err = cudaErrorInvalidValue;  // bucket_unsupported() rejects these first
  if (p.D % 8 != 0) return err;
  dispatch_bucket<kBuckets...>(p.D, [&](auto bucket) {
    err = launch_config<Config<decltype(bucket)::value, kStages>>(p, b, stream, kernel_for);
  });
  return err;
}

template <template <int, int> class Config, int kStages, int... kBuckets>
std::string bucket_unsupported(const AttnProblem& p) {
  int smem = 0;
  const bool ok = p.D % 8 == 0 && dispatch_bucket<kBuckets...>(p.D, [&](auto d) {
                    smem = Config<decltype(d)::value, kStages>::kSmemBytes;
                  });
  return common_unsupported(p, ok, "multiples of 8 up to " + std::to_string(std::max({kBuckets...})),
                            size_t(smem));
}

template <template <int, int> class Config, int kStages, int... kBuckets>
std::string bucket_describe() {
  std::string s = "stages=" + std::to_string(kStages);
  for (int D : {kBuckets...})
    dispatch_bucket<kBuckets...>(D, [&](auto d) {
      using Cfg = Config<decltype(d)::value, kStages>;
      s += "; D<=" + std::to_string(D) + ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
           " warps=" + std::to_string(Cfg::kWarpsM) + "x" + std::to_string(Cfg::kWarpsD) +
           " slice=" + std::to_string(Cfg::kSliceCols) + " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
    });
  return s + "; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
}

}  // namespace attnlab
