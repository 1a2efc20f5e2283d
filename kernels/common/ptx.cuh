// attnlab: thin wrappers over the PTX instructions every rung uses.
//
// Fragment layouts follow the PTX ISA, "Matrix Fragments for mma.m16n8k16"
// (g = lane / 4, t = lane % 4):
//   A 16x16 (row):  a0 = A[g][2t..2t+1]     a1 = A[g+8][2t..2t+1]
//                   a2 = A[g][2t+8..2t+9]   a3 = A[g+8][2t+8..2t+9]
//   B 16x8  (col):  b0 = B[2t..2t+1][g]     b1 = B[2t+8..2t+9][g]
//   C 16x8  (f32):  c0,c1 = C[g][2t..2t+1]  c2,c3 = C[g+8][2t..2t+1]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace attnlab {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- global -> shared, asynchronous (sm_80+) -------------------------------
// Copies 16 bytes; when `valid` is false the 16 shared bytes are zero-filled and
// global memory is not read (src-size 0), which is how ragged tiles are padded.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes));
}
// Copies 4 bytes (cp.async.ca: the .cg form takes 16-byte copies only); used
// for per-row scalars (the dmattn backward's LSE and Δ of the next tile).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `kPending` of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- shared -> registers ---------------------------------------------------
// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and
// register i of every lane receives its slice of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
// Same, each 8x8 matrix transposed on the way (used for V in P·V).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// ---- registers -> shared (sm_90) --------------------------------------------
// ldmatrix_x4 backwards: lanes 8i..8i+7 give the row addresses of matrix i,
// and register i of every lane is its slice of matrix i (the m16n8 C-fragment
// layout: lane l holds row l / 4, columns 2·(l % 4) and +1). One instruction
// writes 16 bytes per lane where four 4-byte stores would (PTX ISA,
// "stmatrix"; rung 11's P̃ staging).
__device__ __forceinline__ void stmatrix_x4(void* smem, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(smem)), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#endif
}

// ---- tensor cores: D = A·B + D, fp32 accumulate ---------------------------
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                   uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values -> one register holding two 16-bit values (lo = x, hi = y).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<half>(float x, float y) {
  half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Barrier over the `threads` threads (whole warps) that use barrier `id`
// (1..15; __syncthreads is barrier 0). Orders their shared-memory accesses.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Counts the calling warp's threads towards barrier `id` without waiting for
// it: the signalling half of a producer/consumer hand-off, where the other
// side calls named_barrier_sync with the same `threads` (rung 12's ping-pong).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same two for threads that reach one barrier at different instructions
// (warpgroups in different roles that both wait, as in rung 15): bar.sync and
// bar.arrive are barrier.sync.aligned and barrier.arrive.aligned, which
// require every participating thread to execute the same instruction
// (compute-sanitizer's synccheck reports "divergent threads" otherwise).
__device__ __forceinline__ void named_barrier_sync_any(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive_any(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Programmatic dependent launch (sm_90; PTX ISA, "griddepcontrol"). A kernel
// launched with the programmatic-stream-serialization attribute may start
// while the kernel before it in the stream still runs; griddep_wait() blocks
// until that kernel has completed and its memory is visible, so everything
// after it may read what the previous kernel wrote. griddep_launch_dependents()
// lets the next such kernel start launching once every block of this one has
// called it (or exited). Both are no-ops below sm_90 (and without the attribute).
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// *a += x, *(a + 1) += y in global fp32 (a 8-byte aligned): one vector
// reduction on sm_90 (red.global.add.v2.f32), half the atomic operations;
// two atomics before it. The backwards' dQ (and dK, dV of split walks).
__device__ __forceinline__ void atomic_add2(float* a, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(a), make_float2(x, y));
#else
  atomicAdd(a, x);
  atomicAdd(a + 1, y);
#endif
}

// Hides an int from the optimiser at this point (wgmma.cuh's opaque does the
// same for descriptors). A lane index taken through it inside a loop makes the
// offsets derived from it be recomputed there, a few integer instructions,
// instead of hoisted out of the loop into registers of their own for its whole
// length (which a register-bound loop then spills).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// 2^x on the special-function unit (exp2(-inf) = 0). The softmax works in the
// exp2 domain with log2(e) folded into the scale, as FlashAttention does.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace attnlab
