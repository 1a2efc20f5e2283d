// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the host side that the Hopper backward rungs (14 and 15) share —
// their workspace, the shapes they refuse, and the launch around the main
// kernel: the pre-pass (Δ, LSE·log2e; it zeroes the dQ accumulator and the
// deterministic mode's turn counters too), the tensor maps, and dQ's cast.
// A rung gives its head dims, its configs (Cfg<D, Dv>: kBr, kBc, kThreads,
// kSmemBytes) and its kernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

#include "common/bwd_prepost.cuh"
#include "hopper/bwd_scheduler.h"
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/env_switch.h"
#include "host/launch.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {

// The workspace: LSE·log2e and Δ per padded row, dQ's fp32 accumulator, and
// (deterministic) one turn counter per dQ tile; each part 256-byte aligned.
struct BwdWorkspace {
  float* lse2 = nullptr;
  float* delta = nullptr;
  float* dq_accum = nullptr;
  int* dq_turns = nullptr;
  size_t bytes = 0;
  size_t zeroed_bytes = 0;  // from dq_accum on: the accumulator and the turns, zeroed before each run
};

inline size_t bwd_align256(size_t n) { return (n + 255) / 256 * 256; }

inline BwdWorkspace bwd_workspace(const AttnProblem& p, int Br, void* base) {
  const int64_t rows = p.heads() * bwd_padded_rows(p.Nq, Br);
  const size_t row_bytes = bwd_align256(size_t(rows) * 4), acc_bytes = bwd_align256(size_t(rows) * p.D * 4);
  const size_t turn_bytes = bwd_align256(size_t(rows / Br) * 4);
  BwdWorkspace w;
  w.bytes = 2 * row_bytes + acc_bytes + turn_bytes;
  w.zeroed_bytes = acc_bytes + turn_bytes;
  if (base != nullptr) {
    char* at = static_cast<char*>(base);
    w.lse2 = reinterpret_cast<float*>(at);
    w.delta = reinterpret_cast<float*>(at + row_bytes);
    w.dq_accum = reinterpret_cast<float*>(at + 2 * row_bytes);
    w.dq_turns = reinterpret_cast<int*>(at + 2 * row_bytes + acc_bytes);
  }
  return w;
}

// The tensor maps a Hopper backward kernel takes: Q, dO in boxes of Br rows,
// K, V in boxes of Bc rows.
struct BwdMaps {
  CUtensorMap q, k, v, dout;
};

// Bytes of workspace a rung needs for p (0 where it does not run p's head dims).
template <typename HeadDimsList, template <int, int> class Cfg>
size_t bwd_ws_workspace_bytes(const AttnProblem& p) {
  int Br = 0;
  HeadDimsList::dispatch(p.D, p.Dv, [&](auto dims) { Br = Cfg<decltype(dims)::D, decltype(dims)::Dv>::kBr; });
  return Br > 0 ? bwd_workspace(p, Br, nullptr).bytes : size_t(0);
}

// Why a rung with these head dims and configs does not run p ("" when it does).
template <typename HeadDimsList, template <int, int> class Cfg>
std::string bwd_ws_unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  int smem = 0, Bc = 0;
  if (!HeadDimsList::dispatch(p.D, p.Dv, [&](auto dims) {
        using C = Cfg<decltype(dims)::D, decltype(dims)::Dv>;
        smem = C::kSmemBytes;
        Bc = C::kBc;
      }))
    return HeadDimsList::not_in(p.D, p.Dv);
  if (p.H > 65535 || p.B > 65535) return "B and H must be <= 65535 (grid limits)";
  if ((int64_t(p.Nk) + Bc - 1) / Bc > 65535)
    return "Nk must be <= 65535 x " + std::to_string(Bc) + " (the key tiles are grid.y in one section)";
  if (int64_t(p.B) * p.kv_heads() * ((p.Nk + Bc - 1) / Bc) > INT32_MAX)
    return "B·Hkv·ceil(Nk / " + std::to_string(Bc) + ") must be < 2^31 (the grid)";
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  return smem_unsupported(size_t(smem));
}

// Runs the backward of p on a rung with these head dims and configs: the
// pre-pass (zeroing the accumulator and the turns), the kernel kernel_of(Cfg{},
// T{}) — one block per item (key tile, KV head and batch) in bwd_order's
// sections (unequal: walks of unequal length, causal or a block mask's; the
// deterministic mode's rule there; ATTNLAB_BWD_NO_SECTIONS=1: every head in
// one section), every Hopper backward kernel taking the same arguments, then
// `extra` (the block-sparse one's block mask and mods) — then dQ's cast.
template <typename HeadDimsList, template <int, int> class Cfg, bool kDeterministic, typename KernelOf,
          typename... Extra>
cudaError_t bwd_ws_launch(const AttnProblem& p, const AttnGradBuffers& b, cudaStream_t stream, bool unequal,
                          KernelOf&& kernel_of, const Extra&... extra) {
  cudaError_t err = cudaErrorInvalidValue;
  HeadDimsList::dispatch(p.D, p.Dv, [&](auto dims) {
    using C = Cfg<decltype(dims)::D, decltype(dims)::Dv>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      const BwdWorkspace ws = bwd_workspace(p, C::kBr, b.workspace);
      if (b.workspace == nullptr || b.workspace_bytes < ws.bytes)
        return launch_failed(cudaErrorInvalidValue, "the workspace holds " + std::to_string(b.workspace_bytes) +
                                                        " bytes; the backward needs " + std::to_string(ws.bytes));
      const int nq_pad = bwd_padded_rows(p.Nq, C::kBr);
      const int64_t kv_heads = int64_t(p.B) * p.kv_heads();
      BwdMaps m;
      if (!encode_head_tiles<C::kBr>(&m.q, b.q, p.dtype, p.heads(), p.Nq, p.D, "Q") ||
          !encode_head_tiles<C::kBr>(&m.dout, b.dout, p.dtype, p.heads(), p.Nq, p.Dv, "dO") ||
          !encode_head_tiles<C::kBc>(&m.k, b.k, p.dtype, kv_heads, p.Nk, p.D, "K") ||
          !encode_head_tiles<C::kBc>(&m.v, b.v, p.dtype, kv_heads, p.Nk, p.Dv, "V"))
        return cudaErrorInvalidValue;  // (launch_detail() says which map and why)
      // The pre-pass zeroes the accumulator and the turn counters behind it (whole 256-byte parts).
      cudaError_t e = launch_bwd_row_stats<T>(p, b, ws.lse2, ws.delta, nq_pad, stream, ws.dq_accum,
                                              int64_t(ws.zeroed_bytes / 4));
      if (e != cudaSuccess) return launch_step(e, "the pre-pass (Δ, LSE·log2e)");
      const BwdOrder order = bwd_order(p, C::kBc, unequal, env_switch_on("ATTNLAB_BWD_NO_SECTIONS"),
                                       int64_t(device_l2_bytes()), device_sm_count(), kDeterministic);
      const dim3 grid = bwd_grid(p, order);
      e = launch_with_smem(kernel_of(C{}, type), grid, C::kThreads, C::kSmemBytes, stream, m.q, m.k, m.v, m.dout,
                           ws.dq_accum, static_cast<const float*>(ws.lse2), static_cast<const float*>(ws.delta), ws.dq_turns,
                           static_cast<T*>(b.dk), static_cast<T*>(b.dv), p, nq_pad, order, extra...);
      if (e != cudaSuccess)
        return launch_step(e, "the main kernel (grid " + std::to_string(grid.x) + " x " + std::to_string(grid.y) +
                                  ", " + std::to_string(C::kThreads) + " threads, " +
                                  std::to_string(C::kSmemBytes) + " B shared memory)");
      return launch_step(launch_bwd_dq_convert<T>(p, ws.dq_accum, b.dq, nq_pad, stream, C::kBr), "dQ's cast");
    });
  });
  return err;
}

// A Hopper backward rung's variant, `name` or `name+deterministic`: its
// refusals, workspace and launch from its head dims, configs and kernel_of
// (as bwd_ws_launch takes it); described as `what` (+ the deterministic
// mode's order), then `tiles()`.
template <typename HeadDimsList, template <int, int> class Cfg, bool kDeterministic, typename KernelOf>
BwdVariant bwd_ws_variant(const std::string& name, const std::string& rung, KernelOf kernel_of,
                          const std::string& what, std::function<std::string()> tiles) {
  BwdVariant v;
  v.name = kDeterministic ? name + "+deterministic" : name;
  v.rung = rung;
  v.deterministic = kDeterministic;
  v.unsupported_reason = bwd_ws_unsupported<HeadDimsList, Cfg>;
  v.workspace_bytes = bwd_ws_workspace_bytes<HeadDimsList, Cfg>;
  v.launch = [kernel_of](const AttnProblem& p, const AttnGradBuffers& b, cudaStream_t stream) {
    launch_detail().clear();
    return bwd_ws_launch<HeadDimsList, Cfg, kDeterministic>(p, b, stream, p.causal, kernel_of);
  };
  v.last_error = [] { return launch_detail(); };
  v.describe = [what, tiles] {
    return what + (kDeterministic ? " in key-tile order (bitwise reproducible)" : "") + "; " + tiles();
  };
  return v;
}

}  // namespace attnlab
