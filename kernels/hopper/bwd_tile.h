// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: rung 14's backward tile per head dims, which the variable-length
// backward (kernels/varlen/) runs too. Rung 14's header tabulates them.
#pragma once

#include "hopper/bwd_mainloop.cuh"

namespace attnlab {

// The query tile per (D, Dv): at D = 64 Sᵀ, dPᵀ of 128 queries fit next to
// dK, dV (64 registers each); at D = 128 dK, dV take 128, so 64 queries.
template <int kHeadDim, int kHeadDimV>
struct BwdWsTile;
// kEarlyDv: dV's MMA issued before dS is computed (registers allow it at D = 128).
// kDsBuffers, kDqBuffers: dSᵀ and the dQ staging double-buffered where shared
// memory allows (else a barrier per tile, and a wait for the dQ writer's read);
// at D = 64 two dSᵀ buffers measure faster than two dQ buffers.
// kSliceQ: Sᵀ and dPᵀ in slices of this many queries (registers at D = 192).
template <> struct BwdWsTile<64, 64>   { static constexpr int kBr = 128, kSliceQ = 128, kDsBuffers = 2, kDqBuffers = 1; static constexpr bool kEarlyDv = false; };
template <> struct BwdWsTile<128, 128> { static constexpr int kBr = 64,  kSliceQ = 64,  kDsBuffers = 2, kDqBuffers = 2; static constexpr bool kEarlyDv = true; };
template <> struct BwdWsTile<192, 128> { static constexpr int kBr = 64,  kSliceQ = 32,  kDsBuffers = 1, kDqBuffers = 1; static constexpr bool kEarlyDv = false; };

// The block around the tile (its shared memory, barriers, dQ split): BwdWsConfig, hopper/bwd_mainloop.cuh.
constexpr int kBwdWsStages = 2;
template <int D, int Dv>
using BwdWsEngineConfig = BwdWsConfig<D, Dv, BwdWsTile<D, Dv>::kBr, BwdWsTile<D, Dv>::kSliceQ, BwdWsTile<D, Dv>::kEarlyDv,
                                      BwdWsTile<D, Dv>::kDsBuffers, BwdWsTile<D, Dv>::kDqBuffers, kBwdWsStages>;

}  // namespace attnlab
