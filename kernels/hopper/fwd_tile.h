// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the forward engine's tile per head dims, which rung 12 and the
// variable-length forward (kernels/varlen/) both run: the key tile Bc, the
// compute warpgroups W (Br = 64·W) and whether they take turns on the tensor
// cores. FlashAttention-3's tiles (hopper/tile_size.h): at D = 64 three
// warpgroups (FA3's 192 x 192 tile passes P through shared memory; with P in
// registers, 128 keys fit 160 registers), 176 keys at D = 128, 80 at D = 256;
// FA3 takes turns up to D = 128. Rung 12's header tabulates them.
#pragma once

#include "hopper/fwd_mainloop.cuh"

namespace attnlab {

template <int kHeadDim, int kHeadDimV>
struct WsTile;
template <> struct WsTile<64, 64>   { static constexpr int kBc = 128, kWarpgroups = 3; static constexpr bool kPingpong = true; };
template <> struct WsTile<128, 128> { static constexpr int kBc = 176, kWarpgroups = 2; static constexpr bool kPingpong = true; };
template <> struct WsTile<256, 256> { static constexpr int kBc = 80, kWarpgroups = 2; static constexpr bool kPingpong = false; };
template <> struct WsTile<192, 128> { static constexpr int kBc = 128, kWarpgroups = 2; static constexpr bool kPingpong = true; };  // DeepSeek V3's prefill
template <> struct WsTile<128, 64>  { static constexpr int kBc = 128, kWarpgroups = 2; static constexpr bool kPingpong = true; };

// The K and V rings' slots.
constexpr int kWsStages = 2;

// The mainloop's config (hopper/fwd_mainloop.cuh) of the engine's tile at (D, Dv).
template <int D, int Dv>
using WsEngineConfig = WsConfig<D, Dv, WsTile<D, Dv>::kBc, WsTile<D, Dv>::kWarpgroups, kWsStages>;

}  // namespace attnlab
