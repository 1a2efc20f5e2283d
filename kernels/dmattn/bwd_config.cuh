// attnlab: the dynamic-mask backward's tile configuration (DmaBwdConfig),
// shared by its kernels and its launch (dmattn_bwd.cu, whose header holds the
// table these constants are checked against), and the main kernel's layout of
// shared memory (DmaBwdSmem). (File-local namespace: each including file gets
// its own copy, and the kernels' symbols stay those of dmattn_bwd.cu.)
#pragma once

#include <cstdint>

#include "dmattn/dmattn.h"
#include "host/rung_host.cuh"

namespace attnlab {
namespace {

// The head dims of the two cores (D = Dv): wgmma those of the wgmma wrappers'
// N (the head dim of dV, dK, dQ).
using DmaBwdHeadDims = EqualHeadDims<32, 64, 96, 128>;
using DmaBwdWgmmaHeadDims = EqualHeadDims<64, 128>;

template <int kHeadDim_, bool kWgmma_ = false>
struct DmaBwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  // The blocks per SM the registers are bounded for (launch bounds): the
  // wgmma core at D = 64 three (168 registers; 12 warps per SM instead of 8:
  // faster on dense and causal masks than two blocks, and than two 32-query
  // slices, measured when it spilled 60 bytes; docs/experiments.md).
  // Elsewhere 1: dK, dV alone take 2·D/2 registers per thread, so D = 128
  // stays at 248, two blocks.
  static constexpr int kMinBlocks = kWgmma_ && kHeadDim_ == 64 ? 3 : 1;
  // At 168 registers (three blocks) the lane's offsets of the dSᵀ and dQ
  // stores and of the slow path's mask and bias reads are recomputed per tile
  // (opaque, common/ptx.cuh) instead of held across the walk, where they
  // spilled (64 bytes); with one block bound they fit.
  static constexpr bool kLaneOffsetsPerTile = kMinBlocks > 1;
  // kWgmma: the five products as warpgroup MMAs (sm_90a; see the kernel).
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kBr = 64, kBc = 64, kWarps = 4, kThreads = 32 * kWarps;
  // mma.sync: rows padded by 8 halves; wgmma: dense rows in the 128-byte
  // swizzle (Sw128Blocks<64>), tiles 1024-byte aligned (+ 1024 bytes slack).
  static constexpr int kStride = kWgmma ? kHeadDim : kHeadDim + 8;
  static constexpr int kDsStride = kWgmma ? kBr : kBr + 8;
  // wgmma: two slots for Q_i, dO_i (and LSE, Δ): the next active slot's
  // tiles are copied while this one is computed, instead of every tile
  // starting with a wait for its loads (latency: two blocks per SM).
  static constexpr int kQdoStages = kWgmma ? 2 : 1;
  // wgmma: dQ of a tile (64 x D fp32, scaled) is staged in the tile's own Q/dO
  // slot, dead once dK and dV are done (the next tile's tiles are in the other
  // slot) — 64·D·4 bytes, exactly the slot's Q and dO — as D/32 boxes of 32
  // columns in the 128-byte swizzle, and added to dq_accum by one TMA tensor
  // reduction per box, all issued by one thread: fewer issues than one bulk
  // reduction per row from 64 threads (serialised lane by lane, with the
  // tile's end waiting on a barrier behind them) or than fp32 atomics.
  static constexpr bool kDqTma = kWgmma;
  static constexpr int kDqBoxCols = 32;  // fp32 columns per 128-byte swizzle row
  static_assert(kDqBoxCols * 4 == 128, "a dQ box row is the 128-byte swizzle's span");
  static constexpr int kQdoSlotElems = 2 * 64 * kStride;  // Q, dO, 16-bit
  static_assert(!kDqTma || kBr * kHeadDim * 4 == kQdoSlotElems * 2, "dQ's fp32 boxes fill a Q/dO slot");
  static_assert(kQdoSlotElems * 2 % 1024 == 0, "slots keep the 128-byte swizzle's 1024-byte alignment");
  static constexpr int kSmemBytes = (2 * 64 * kStride + kQdoStages * kQdoSlotElems + kBc * kDsStride) * 2 +
                                    kQdoStages * 2 * kBr * 4 + (kWgmma ? 1024 : 0);
  // Queries per Sᵀ slice: two halves of 32 (registers: Sᵀ and dPᵀ next to dK
  // and dV), or with wgmma at D = 64 all 64 at once (m64n64; two slices
  // there, one's dV, dK under the other's score code as at D = 128, are
  // slower).
  static constexpr int kHalf = kWgmma && kHeadDim <= 64 ? kBr : kBr / 2;
  static constexpr int kTilesS = kHalf / 8;  // n8 tiles across the queries of a slice
  static constexpr int kTilesO = kHeadDim / 8;
  static constexpr int kDqParts = kHeadDim >= 128 ? 2 : 1;  // dQ columns in parts (registers)
  // wgmma at D = 128: both dQ parts' products issued before the first wait
  // (two commit groups), so part 1's runs under part 0's stores into the
  // staging boxes; at that point only dK, dV and both dQ parts are live
  // (248 registers instead of 228, no spill, still two blocks per SM): faster
  // on dense, causal and GQA shapes, the same on a sparse top-W mask.
  static constexpr bool kDqPartsTogether = kWgmma && kHeadDim == 128;
  static_assert(!kDqPartsTogether || kHeadDim / 64 == 2, "the kernel holds two dQ parts of 64 columns");
  static_assert(kTilesO % (2 * kDqParts) == 0, "dQ parts of whole 16-column steps");
};

// The main kernel's shared memory, kSmemBytes: K_j, V_j, kQdoStages slots of
// Q_i, dO_i (and LSE_i, Δ_i), and dSᵀ. The tiles are padded rows (mma.sync) or
// Sw128Blocks<64> (wgmma), these 1024-byte aligned: the period of the
// 128-byte swizzle.
template <typename Cfg, typename T>
struct DmaBwdSmem {
  T* sK;              // [Bc][kStride] K_j
  T* sV;              // [Bc][kStride] V_j
  T* sQ_slots;        // slot s: Q_i [Br][kStride] at sQ_slots + s·kQdoSlotElems, dO_i after it
  T* sdS;             // [Bc keys][kDsStride] dSᵀ
  float* sLSE_slots;  // slot s: LSE_i, then Δ_i (2·Br floats)

  __device__ __forceinline__ explicit DmaBwdSmem(unsigned char* smem_raw) {
    sK = reinterpret_cast<T*>(smem_raw);
    if constexpr (Cfg::kWgmma) {
      const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
      sK = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    }
    sV = sK + Cfg::kBc * Cfg::kStride;
    sQ_slots = sV + Cfg::kBc * Cfg::kStride;
    sdS = sQ_slots + Cfg::kQdoStages * Cfg::kQdoSlotElems;
    sLSE_slots = reinterpret_cast<float*>(sdS + Cfg::kBc * Cfg::kDsStride);
  }
};

}  // namespace
}  // namespace attnlab
