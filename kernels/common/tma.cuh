// attnlab: the Tensor Memory Accelerator (TMA, sm_90), the mbarriers that
// count its bytes, and the thread-block clusters that let one TMA copy land in
// several blocks' shared memory (multicast) and a block read or write a
// partner's shared memory (mapa, ld.shared::cluster, st.async); at the end,
// the tensor store and reduction from shared to global memory.
//
// TMA copies a box of a tensor between global and shared memory as one
// instruction issued by one thread. The tensor's shape, strides, box size and
// shared-memory swizzle live in a 128-byte CUtensorMap built on the host
// (host/tensor_map.h) and passed to the kernel as a __grid_constant__
// parameter. Rows of the box past the tensor's end are filled with zeros.
//
// Completion is signalled through an mbarrier, a 64-bit shared-memory object
// with a phase bit: it completes a phase when its expected arrivals have
// arrived and the bytes it was told to expect (expect_tx) have landed, then
// flips the phase. Waiters spin on "has the phase of parity P completed?".
// PTX ISA, "Tensor Copy Instructions" (cp.async.bulk.tensor) and "mbarrier";
// the wrappers follow the shape of CUTLASS's cute/arch/copy_sm90_tma.hpp and
// cutlass/arch/barrier.h (ClusterBarrier, ClusterTransactionBarrier).
#pragma once

#include <cuda.h>  // CUtensorMap: the type only, nothing is linked against libcuda

#include <cstdint>

#include "common/ptx.cuh"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- device: mbarriers ------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the cluster (and to the async
// proxy that TMA signals through); the init thread issues it before the
// block (or cluster) barrier that follows initialisation.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also tells the barrier to expect `bytes` more bytes this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// One arrival on this block's barrier.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival on the barrier at the same shared-memory offset in block `cta_rank`
// of the cluster (which may be this block).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(cta_rank)
      : "memory");
}
// The same arrival without the cluster-scope release: for a consumer that only
// says "I have finished reading this slot" (its reads, by wgmma, are complete
// when it arrives, so there is nothing to publish), as CUTLASS's
// ClusterBarrier::arrive(cta_id) does. The release.cluster form costs a
// MEMBAR.ALL.GPU per arrival.
__device__ __forceinline__ void mbarrier_arrive_remote(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(cta_rank)
      : "memory");
}
// Spins until the phase of parity `parity` has completed (phase k has parity k % 2).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// A 1-D bulk copy (cp.async.bulk, no tensor map) of `bytes` contiguous bytes
// from global to shared memory, counted on `bar` like a TMA box: both
// addresses 16-byte aligned, `bytes` a multiple of 16. The backward's rows of
// LSE and Δ (padded per head to whole query tiles, so always in range).
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// ---- device: TMA loads -----------------------------------------------------------
// Brings the tensor map into the TMA unit's cache before its first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Box (c0, c1, c2) (innermost coordinate first, in elements) of `map` into
// `smem`; its bytes are counted on `bar` (which must expect them).
__device__ __forceinline__ void tma_load_3d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// The same box written to the same shared-memory offset in every block of the
// cluster named in `cta_mask` (bit r = rank r), and counted on the barrier at
// `bar`'s offset in each of them: one read from L2, several destinations.
__device__ __forceinline__ void tma_load_3d_multicast(void* smem, const CUtensorMap* map, uint64_t* bar, int c0,
                                                      int c1, int c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%4, %5, %6}], [%2], %3;\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- device: clusters -------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_num_ctas() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// Distributed shared memory: the address, in the cluster's shared window, of
// the variable at `p`'s offset in block `cta_rank` (PTX ISA, "mapa");
// ld.shared::cluster reads it, local or remote alike.
__device__ __forceinline__ uint32_t map_shared_rank(const void* p, uint32_t cta_rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(p)), "r"(cta_rank));
  return remote;
}
__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t cluster_addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_addr)
               : "memory");
  return v;
}
// An asynchronous 16-byte store into the shared memory of block `cta_rank`
// (the same offset as `p` there), whose bytes complete on that block's
// mbarrier at `bar`'s offset, as a TMA load's do: the receiver waits on its
// own barrier (expecting the bytes), the sender neither waits nor needs a
// fence (PTX ISA, "st.async"; sm_90).
__device__ __forceinline__ void st_async_f4(const void* p, const uint64_t* bar, uint32_t cta_rank, float4 v) {
  asm volatile(
      "{\n.reg .b32 dst, remote_bar;\n"
      "mapa.shared::cluster.u32 dst, %0, %2;\n"
      "mapa.shared::cluster.u32 remote_bar, %1, %2;\n"
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [dst], {%3, %4, %5, %6}, [remote_bar];\n}\n" ::"r"(
          smem_addr(p)),
      "r"(smem_addr(bar)), "r"(cta_rank), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
      : "memory");
}
// mbarrier_wait with acquire at cluster scope: what the arriving threads of
// other blocks wrote before their (release.cluster) arrivals is visible to
// this thread afterwards. The plain wait acquires at CTA scope only.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_CLUSTER:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_CLUSTER;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Every thread of every block of the cluster meets here (all threads of a
// warp together: .aligned).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Tensor reduction (cp.reduce.async.bulk.tensor, sm_90, the async proxy):
// the global box (c0, c1, c2) of `map` += the box in shared memory at `smem`
// (the map's layout: swizzled as the map says, 1024-byte aligned for the
// 128-byte swizzle), element by element; rows of the box past the tensor's
// end are not written. One instruction from one thread, in that thread's bulk
// group (committed by bulk_commit), waited for with bulk_wait_read (`smem` may
// be rewritten) or bulk_wait (the global writes done). FA3 adds its dQ this
// way (a TMA reduce-add of a shared-memory tile, hopper/epilogue_bwd.hpp)
// instead of per-element atomics; the dmattn backward's wgmma core does too.
// (PTX ISA, "cp.reduce.async.bulk.tensor"; the form of CUTLASS's
// SM90_TMA_REDUCE_ADD_3D.)
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, const void* smem, int c0, int c1,
                                                  int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}
// Tensor store (cp.async.bulk.tensor, shared → global, the async proxy), issued
// by the threads where `issue` holds: the box at `smem` (in the map's swizzled
// layout, 1024-byte aligned) to the global box (c0, c1, c2); rows past the
// tensor's end are not written. Same bulk-group bookkeeping as the reduction
// above. The writers of `smem` make their stores visible to the async proxy
// first (fence_proxy_async_shared, then a barrier). A predicated instruction
// rather than a branch around it: rung 11's pass 1 stores P̃ this way while
// wgmmas are in flight, and ptxas waits for those before a branch (C7517).
__device__ __forceinline__ void tma_store_3d_if(bool issue, const CUtensorMap* map, const void* smem, int c0, int c1,
                                                int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " @p cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n}\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(int(issue))
      : "memory");
#endif
}
// Bulk reduction (cp.reduce.async.bulk, sm_90, the async proxy): `bytes`
// contiguous bytes of fp32 at `gmem` += those at `smem`, element by element
// (both 16-byte aligned, bytes a multiple of 16); one instruction from one
// thread, in its bulk group like the tensor reduction above. FA3 adds dQ so:
// its accumulator is laid out tile by tile in the order a tile is staged in,
// so that a tile's add is one copy (SM90_BULK_REDUCE_ADD, hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

}  // namespace attnlab
