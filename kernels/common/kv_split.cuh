// attnlab: one work item's keys computed by several blocks (stream-K; the
// split is planned in hopper/fwd_scheduler.h). A block that computes only
// part of an item's keys leaves the item's partial state — O unnormalised in
// fp32, each row's running max m and each lane's share of the running sum l,
// in the online softmax's fragment layout (online_softmax.cuh) — in a
// workspace slot of its own, and raises that slot's flag. The block that
// computes the item's last keys waits for those flags, merges each state into
// its own the way the online softmax merges two key tiles, and stores O and
// LSE. Both blocks run the same warps, so a thread reads back exactly the
// fragment its counterpart wrote.
//
// The handshake is CUTLASS's generic barrier (cutlass/barrier.h): every
// thread stores, the threads meet, one thread releases the flag at GPU scope;
// on the other side one thread spins on an acquiring load, then the threads
// meet and read (through L2: __ldcg). A flag holds its launch's token, never
// 0, so that what an earlier launch or another kernel left in a workspace is
// not taken for a partial of this one; the merging thread clears the flag
// once it has seen it, so that a CUDA graph replaying one launch (and so one
// token) starts every replay from cleared flags.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)  // the device code below; the plan's part compiles with any C++ compiler
#include "common/online_softmax.cuh"
#endif

namespace attnlab {

struct KvSplitArgs {
  unsigned long long* flags = nullptr;  // [blocks], 16 bytes apart
  float4* partials = nullptr;           // [blocks][kTilesO + 1][threads]
  unsigned long long token = 0;
};

// Workspace for `blocks` slots of `threads` threads holding tiles_o O tiles each.
constexpr size_t kv_split_workspace_bytes(int blocks, int threads, int tiles_o) {
  return size_t(blocks) * 16 + size_t(blocks) * size_t(tiles_o + 1) * size_t(threads) * 16;
}

// The arguments for one launch: the workspace (16-byte aligned) and a token
// no other launch of this process has had.
inline KvSplitArgs kv_split_args(void* workspace, int blocks) {
  static std::atomic<unsigned long long> next{
      (static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()) << 1) | 1ull};
  KvSplitArgs a;
  a.flags = static_cast<unsigned long long*>(workspace);
  a.partials = reinterpret_cast<float4*>(static_cast<unsigned char*>(workspace) + size_t(blocks) * 16);
  a.token = next.fetch_add(2);  // odd: never 0
  return a;
}

#if defined(__CUDA_ARCH__)

// By all kThreads threads of the compute warps (named barrier `barrier`):
// this thread's O and statistics into slot `slot`, then the slot's flag.
template <int kTilesO, int kThreads>
__device__ __forceinline__ void kv_split_store_partial(const KvSplitArgs& a, int slot, const float (&O)[kTilesO][4],
                                                       const RowStats& st, int tid, int barrier) {
  float4* dst = a.partials + size_t(slot) * (kTilesO + 1) * kThreads + tid;
#pragma unroll
  for (int n = 0; n < kTilesO; ++n) __stcg(dst + n * kThreads, make_float4(O[n][0], O[n][1], O[n][2], O[n][3]));
  __stcg(dst + kTilesO * kThreads, make_float4(st.m[0], st.m[1], st.l[0], st.l[1]));
  named_barrier_sync(barrier, kThreads);  // every thread's stores come before the release below
  if (tid == 0)
    asm volatile("st.release.gpu.global.u64 [%0], %1;\n" ::"l"(a.flags + 2 * slot), "l"(a.token) : "memory");
}

// By one thread: until slot `slot`'s partial of this launch is there; then
// clears its flag. The caller's threads meet after it, then merge.
__device__ __forceinline__ void kv_split_wait(const KvSplitArgs& a, int slot) {
  unsigned long long seen;
  do {
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(seen) : "l"(a.flags + 2 * slot) : "memory");
  } while (seen != a.token);
  a.flags[2 * slot] = 0;
}

// The partial state in slot `slot` merged into this thread's (O, st): both
// rescaled to the larger running max, as online_softmax_scores does per tile.
template <int kTilesO, int kThreads>
__device__ __forceinline__ void kv_split_merge_partial(const KvSplitArgs& a, int slot, float (&O)[kTilesO][4],
                                                       RowStats& st, float scale_log2, int tid) {
  const float4* src = a.partials + size_t(slot) * (kTilesO + 1) * kThreads + tid;
  const float4 other = __ldcg(src + kTilesO * kThreads);
  const float m_other[2] = {other.x, other.y}, l_other[2] = {other.z, other.w};
  float mine[2], theirs[2];  // the factors of this state and the other
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(st.m[r], m_other[r]);
    const float base = softmax_shift(m_new, scale_log2);
    mine[r] = rescale_factor(st.m[r], base, scale_log2);
    theirs[r] = rescale_factor(m_other[r], base, scale_log2);
    st.l[r] = st.l[r] * mine[r] + l_other[r] * theirs[r];
    st.m[r] = m_new;
  }
#pragma unroll
  for (int n = 0; n < kTilesO; ++n) {
    const float4 x = __ldcg(src + n * kThreads);
    O[n][0] = O[n][0] * mine[0] + x.x * theirs[0];
    O[n][1] = O[n][1] * mine[0] + x.y * theirs[0];
    O[n][2] = O[n][2] * mine[1] + x.z * theirs[1];
    O[n][3] = O[n][3] * mine[1] + x.w * theirs[1];
  }
}

#endif  // __CUDA_ARCH__

}  // namespace attnlab
