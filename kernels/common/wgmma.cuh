// attnlab: Hopper warpgroup MMA (wgmma, sm_90a) and the shared-memory layout
// it reads, for every kernel that issues wgmma.
//
// A warpgroup is 4 consecutive warps (128 threads, first warp index divisible
// by 4). One wgmma.mma_async m64nNk16 multiplies a 64x16 A by a 16xN B into a
// 64xN fp32 accumulator spread over the warpgroup: warp w holds rows 16w..16w+15
// in exactly the mma.m16n8k16 C layout, repeated over N/8 column tiles (so
// d[j][0..3] here is C tile j of ptx.cuh, and the split-Q softmax and epilogue
// work unchanged). B always comes from shared memory, described by a 64-bit
// matrix descriptor; A from shared memory (SS) or from registers in the
// mma.m16n8k16 A layout (RS).
//
// The instruction is asynchronous: issue (wgmma_fence first, if registers it
// reads were just written), commit the group, and wait before reading the
// accumulators. PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-
// Accumulate Instructions"; the descriptor layouts follow CUTLASS's
// make_gmma_desc comments (cute/arch/mma_sm90_desc.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace attnlab {

// ---- the 128-byte-swizzled layout ------------------------------------------
// Tiles of kRows x kCols 16-bit elements (kCols a multiple of 64) are stored as
// kCols/64 column blocks of [kRows][64]: each row of a block is 128 bytes (8
// chunks of 16 bytes), and chunk c of row r sits at chunk c ^ (r % 8). Eight
// rows (1024 bytes) form one swizzle atom; blocks must start 1024-byte aligned.
// This is the layout wgmma calls SWIZZLE_128B, for K-major operands (Q, K: the
// reduction dim, D, contiguous) and N-major ones (V: the output dim contiguous)
// alike. The same XOR as SwizzledRows (smem_layout.cuh), per 64-column block.
template <int kRows>
struct Sw128Blocks {
  static constexpr int kStride = 64;        // elements per stored row (for tile_copy's alignment check)
  static constexpr int kBlockElems = kRows * 64;
  __device__ __forceinline__ static int offset(int row, int col) {
    return (col >> 6) * kBlockElems + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
  }
};

// Matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
//   bits  0-13  start address >> 4      bits 16-29  leading-dim byte offset >> 4
//   bits 32-45  stride-dim byte offset >> 4      bits 62-63  swizzle (1 = 128B)
// K-major SW128 (Q, K): SBO = 1024 (from one 8-row group to the next); LBO is
// unused. Stepping 16 elements along K inside a 64-wide block adds 32 bytes to
// the start address (the hardware applies the XOR on the final address).
// N-major SW128 (V, trans-b): LBO = bytes between 64-column blocks, SBO = 1024
// (from one group of 8 K-rows to the next).
__device__ __forceinline__ uint64_t make_sw128_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = (addr & 0x3FFFFu) >> 4;
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFFu) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFFu) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

// The descriptor `desc` with its start address moved `byte_offset` bytes on
// (the start field counts 16-byte units and cannot overflow inside shared memory).
__device__ __forceinline__ uint64_t advance_desc(uint64_t desc, uint32_t byte_offset) {
  return desc + (byte_offset >> 4);
}
// Hides a value from the optimiser at this point. Descriptors of fixed tiles
// are loop-invariant, and the compiler would otherwise precompute every k-step's
// descriptor before the loop — two registers each, dozens at D = 512 — and
// spill; taking the base through here inside the loop keeps one live.
__device__ __forceinline__ uint64_t opaque(uint64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

// ---- ordering ----------------------------------------------------------------
// Makes this thread's prior generic-proxy shared-memory writes (cp.async,
// st.shared) visible to the async proxy that wgmma reads through. Each writing
// thread issues it, then the block meets at a barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Orders register writes before the wgmma that reads them (accumulators, A).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed wgmma groups are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins the accumulator registers at this point of the program: the compiler may
// not move their reads or writes across it (CUTLASS's warpgroup_fence_operand).
// Used right after wgmma_wait, so nothing reads an accumulator too early.
template <int kTiles>
__device__ __forceinline__ void fence_accumulators(float (&d)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// ---- registers per warpgroup ------------------------------------------------
// setmaxnreg (sm_90a): every thread of the executing warpgroup moves to
// kRegs registers (24..256, a multiple of 8); a decrease returns registers
// to the SM's pool, an increase waits for them. A block whose warpgroups do
// different jobs — one issuing copies, the others computing — gives the
// compute warpgroups the registers the copier does not need
// (FlashAttention-3; CUTLASS's cutlass::arch::warpgroup_reg_alloc/dealloc).
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, multiples of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, multiples of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The warp split of the TMA-fed kernels:
// kComputeWarpgroups compute warpgroups, then one producer warpgroup whose
// first thread issues the copies (setmaxnreg works on whole warpgroups). With
// two compute warpgroups, 384 threads start at 168 registers (an SM
// sub-partition holds 3 of the 12 warps); the producer gives back all but 40
// (with 24 or 32 its loop spills), which lifts the compute warpgroups to 232:
// 128·40 + 256·232 = 384·168. Three compute warpgroups (rung 12 at D = 64)
// start at 128 and split 32 / 160, as FlashAttention-3 does.
template <int kComputeWarpgroups, int kProducerRegs_ = 40, int kComputeRegs_ = 232>
struct ProducerWarpgroupSplit {
  static constexpr int kComputeWarps = 4 * kComputeWarpgroups;
  static constexpr int kProducerWarp = kComputeWarps;  // first warp of the last warpgroup (a multiple of 4)
  static constexpr int kWarps = kComputeWarps + 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kProducerRegs = kProducerRegs_;
  static constexpr int kComputeRegs = kComputeRegs_;
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // what __launch_bounds__(kThreads, 1) leaves
  static_assert(kComputeRegs > kLaunchRegs, "setmaxnreg raises the compute warpgroups");
  // setmaxnreg moves registers between the warpgroups of the block, inside what
  // the launch gave it: .inc waits until .dec has freed enough, so a split that
  // asks for more than kLaunchRegs per thread in all never starts (it hangs).
  static_assert(kProducerRegs + kComputeWarpgroups * kComputeRegs <= (kComputeWarpgroups + 1) * kLaunchRegs,
                "the split fits in the launch's registers (setmaxnreg.inc would wait forever)");
};

// ---- the MMAs ----------------------------------------------------------------
// d (+)= A·Bᵀ, A [64 x 16] and B [N x 16] both K-major in shared memory.
// accumulate = 0 overwrites d (the first k-step).
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate);
// d += A·B, A [64 x 16] from registers (mma.m16n8k16 A fragments, the warp's 16
// rows), B [16 x N] N-major in shared memory (rows of V, head dim contiguous).
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_vt(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b);
// d (+)= A·B, A [64 x 16] M-major in shared memory (stored as [16 K-rows][64],
// e.g. dSᵀ with K = keys) and B [16 x N] N-major (rows along K, as V). Both
// operands transposed against wgmma_ss; valid for 16-bit types only. Used by
// the dynamic-mask backward for dQ = dS·K.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate);

// d (+)= A·B, A [64 x 16] K-major in shared memory and B [16 x N] N-major (rows
// along K, as V). Rung 11's O += P̃·V, where P̃ comes from global memory by TMA.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_vt(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "common/wgmma_ops.inc"

// ---- one attention tile's MMAs (a warpgroup's 64 query rows x one K/V tile) -------
// Issued, not committed or waited for: the caller brackets them with
// wgmma_fence / wgmma_commit / wgmma_wait as its pipeline needs.
// S = Q·Kᵀ over the head dim D: D/16 k-steps. sQ: a warpgroup's 64 rows of a
// Sw128Blocks<kQRows> tile (its 64-column blocks kQRows·64 elements apart); sK:
// a Sw128Blocks<Bc> tile. Both K-major, 8-row groups 1024 bytes apart.
template <typename T, int D, int kQRows, int Bc>
__device__ __forceinline__ void wgmma_qk_tile(float (&S)[Bc / 8][4], const T* sQ, const T* sK) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)  // k-step kk: 64-column block kk/4, 32 bytes further per step inside it
    wgmma_ss<T, Bc>(S, make_sw128_desc(sQ + (kk / 4) * kQRows * 64 + (kk % 4) * 16, 0, 1024),
                    make_sw128_desc(sK + (kk / 4) * Bc * 64 + (kk % 4) * 16, 0, 1024), kk > 0);
}
// O += P·V over the Bc keys: Bc/16 k-steps, P from registers (packed S
// accumulators), sV a Sw128Blocks<Bc> tile of V read N-major: 16 rows per step
// (two 8-row groups), its 64-column blocks Bc·128 bytes apart.
template <typename T, int D, int Bc>
__device__ __forceinline__ void wgmma_pv_tile(float (&O)[D / 8][4], const uint32_t (&P)[Bc / 16][4], const T* sV) {
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) wgmma_rs_vt<T, D>(O, P[kk], make_sw128_desc(sV + kk * 16 * 64, Bc * 128, 1024));
}
// The backward's forms, whose B tile is a slice of a larger one (a part of a
// query tile's rows) and whose descriptors come from one opaque base each,
// advanced per k-step (the backward kernels are register-bound).
// acc (=) A·Bᵀ over kK columns: A the warpgroup's 64 rows of a Sw128Blocks<kARows>
// tile (64-column blocks kARows·128 bytes apart), B kN rows of a
// Sw128Blocks<kBRows> tile starting at `b`; both K-major. Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ.
template <typename T, int kK, int kN, int kARows, int kBRows>
__device__ __forceinline__ void wgmma_rows_tile(float (&acc)[kN / 8][4], const T* a, const T* b) {
  const uint64_t da = opaque(make_sw128_desc(a, 0, 1024)), db = opaque(make_sw128_desc(b, 0, 1024));
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)  // k-step kk: 64-column block kk/4, 32 bytes on inside it
    wgmma_ss<T, kN>(acc, advance_desc(da, (kk / 4) * kARows * 128 + (kk % 4) * 32),
                    advance_desc(db, (kk / 4) * kBRows * 128 + (kk % 4) * 32), kk > 0);
}
// acc += A·B over kRows rows: A from registers (16 rows per k-step), B those
// rows of a Sw128Blocks<kBRows> tile from `b` on, read N-major. dV += Pᵀ·dO, dK += dSᵀ·Q.
template <typename T, int kN, int kRows, int kBRows>
__device__ __forceinline__ void wgmma_rows_rs(float (&acc)[kN / 8][4], const uint32_t (&a)[kRows / 16][4],
                                              const T* b) {
  const uint64_t db = opaque(make_sw128_desc(b, kBRows * 128, 1024));
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) wgmma_rs_vt<T, kN>(acc, a[kk], advance_desc(db, kk * 16 * 128));
}
// acc (=) A·B over kRows rows along K (16 per k-step): A [64 x kRows] read
// M-major from a [kRows][64] tile at `a` (dSᵀ, read as dS), B kN columns of a
// Sw128Blocks<kRows> tile from `b` on, read N-major (64-column blocks
// kRows·128 bytes apart). dQ = dS·K.
template <typename T, int kN, int kRows>
__device__ __forceinline__ void wgmma_rows_tt(float (&acc)[kN / 8][4], const T* a, const T* b) {
  const uint64_t da = opaque(make_sw128_desc(a, kRows * 128, 1024)), db = opaque(make_sw128_desc(b, kRows * 128, 1024));
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk)
    wgmma_ss_tt<T, kN>(acc, advance_desc(da, kk * 16 * 128), advance_desc(db, kk * 16 * 128), kk > 0);
}
#endif

}  // namespace attnlab
