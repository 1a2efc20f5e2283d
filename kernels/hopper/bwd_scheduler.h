// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the Hopper backward's tile scheduler (rungs 14 and 15, the
// block-sparse backward): which (key tile, KV head) item each block of the
// grid takes (bwd_order, bwd_item; bwd_block_item on the device), and the
// walk of one item over the query tiles that see its keys (bwd_work). Host
// and device code; its CPU test is tests/cpu/test_bwd_scheduler.cpp.
#pragma once

#include <cuda_runtime.h>  // dim3

#include <cstdint>

#include "host/attn_problem.h"

namespace attnlab {

// The backward's items, one block each: (key tile, KV head) pairs, in
// sections of KV heads (FlashAttention-3's SingleTileBwdLPTScheduler,
// hopper/tile_scheduler.hpp). Inside a section the KV head is the faster
// index, so key tile 0 of each of its heads, causally the longest walk,
// comes first (longest first); a section is as many heads as keep their Q,
// dO and dQ accumulator in L2 together (bwd_order), so that the blocks
// running side by side, which walk the same heads' query tiles, read them
// from L2 rather than from memory. Sections of `base` or `base + 1` heads
// (the first `extra` of them), whole sections one after the other.
struct BwdOrder {
  int n_k;    // key tiles per KV head
  int base;   // KV heads per section (the first `extra` sections: base + 1)
  int extra;
};
struct BwdItem {
  int j_tile, hk, b;
};
// (In 32 bits: the grid is under 2^31 items, bwd_ws_unsupported.)
ATTNLAB_HOST_DEVICE inline BwdItem bwd_item(const AttnProblem& p, const BwdOrder& o, int item) {
  const int big = (o.base + 1) * o.n_k, small = o.base * o.n_k;
  const int in_big = o.extra * big;  // the items of the first `extra` sections
  const int s = item < in_big ? item / big : o.extra + (item - in_big) / small;
  const int size = o.base + (s < o.extra ? 1 : 0);
  const int first = s * o.base + (s < o.extra ? s : o.extra);  // the section's first KV head
  const int i = item - first * o.n_k;                           // the item inside it
  const int x = first + i % size;                               // b·Hkv + hk
  return {i / size, x % p.kv_heads(), x / p.kv_heads()};
}
// Every item (the grid): B·Hkv·n_k.
ATTNLAB_HOST_DEVICE inline int64_t bwd_items(const AttnProblem& p, const BwdOrder& o) {
  return int64_t(p.B) * p.kv_heads() * o.n_k;
}
// The sections for p (Bc keys per tile) with `l2_bytes` of L2 and `sms` SMs:
//   walks of unequal length (causal, or a block mask's): as many KV heads as
//     keep their query heads' Q, dO (16 bits) and dQ accumulator (fp32)
//     within half the L2 (as rung 12's sections keep K and V, hopper/fwd_scheduler.h;
//     with no L2 to ask, 50 MB), but at least 2·sms / n_k, so that a
//     section's work per SM outlasts its longest walk (else the last
//     section's key tile 0 would end the kernel alone);
//   walks of one length: one KV head per section, its key tiles side by side
//     (FlashAttention-3's non-causal grid, the key tile fastest);
//   one_section (ATTNLAB_BWD_NO_SECTIONS, for the A/B): every head in one
//     section, the key tile the slower index (key tile 0 of every head first).
// In every order a head's key tiles start in ascending order, so the
// deterministic mode's turns (key tile j adds after j − 1) never wait for a
// block that has not started. The deterministic mode (`deterministic`) takes
// one section for walks of one length (unrotated, one head's key tiles side
// by side would queue at every dQ tile's turn), and for unequal walks unless
// the sections are more than three: a section of few heads puts more of one
// head's key tiles side by side, queued at the same turns, which cost more
// than the L2 saves (measured at B = 1, 8 KV heads, in two or three sections:
// 6–12 % slower; at B = 4 H = 16 in eight and B = 2 H = 16 in four: 13 % and
// 4 % faster).
inline BwdOrder bwd_order(const AttnProblem& p, int Bc, bool unequal, bool one_section, int64_t l2_bytes, int sms,
                          bool deterministic = false) {
  BwdOrder o;
  o.n_k = (p.Nk + Bc - 1) / Bc;
  const int64_t heads = int64_t(p.B) * p.kv_heads();
  int64_t per = heads;
  if (!one_section) {
    const int64_t head_bytes = int64_t(p.H / p.kv_heads()) * p.Nq * (2 * (p.D + p.Dv) + 4 * p.D);
    const int64_t fit = (l2_bytes > 0 ? l2_bytes : int64_t(50) << 20) / 2 / head_bytes;
    const int64_t outlast = (2 * int64_t(sms) + o.n_k - 1) / o.n_k;
    per = unequal ? (fit > outlast ? fit : outlast) : 1;
    per = per < 1 ? 1 : per > heads ? heads : per;
    if (deterministic && (!unequal || heads <= 3 * per)) per = heads;
  }
  const int64_t sections = (heads + per - 1) / per;
  o.base = int(heads / sections);
  o.extra = int(heads % sections);
  return o;
}
// Whether o is one section of every head (bwd_grid is then 2-D, its blocks
// in the same order).
inline bool bwd_one_section(const AttnProblem& p, const BwdOrder& o) {
  return int64_t(o.base) == int64_t(p.B) * p.kv_heads();
}

// The grid of order o: one block per item; with one section (KV heads, key
// tiles), the key tile read from blockIdx.y (bwd_block_item), else the items
// in a row.
inline dim3 bwd_grid(const AttnProblem& p, const BwdOrder& o) {
  return bwd_one_section(p, o) ? dim3(unsigned(int64_t(p.B) * p.kv_heads()), unsigned(o.n_k))
                               : dim3(unsigned(bwd_items(p, o)));
}

// One key tile's walk (the tile scheduler of the backward: one block per key
// tile and KV head, in the order of bwd_item above).
// Slot s of n_slots = group · n_m is query head hk·group + s / n_m and one of
// the n_m query tiles that can see a key of this tile:
//   default: m_first + (s % n_m + rot) % n_m, from a per-key-tile offset rot,
//     so that the key tiles running side by side add into different dQ tiles;
//   deterministic (the adds to a dQ tile take turns in key-tile order): the
//     last query tile first, down to m_first, so that every key tile meets the
//     tiles in the same order and waits only for its predecessor's last add,
//     not for it to walk the causal band up to its own first tile.
// A walk is any type with these members (the block-sparse one is another):
// j_tile, kv0, b, kv_head, n_slots; slot(s), called with s ascending (so a
// walk may keep a cursor: each role walks its own copy), giving the query
// head h (in the batch) and the query tile m; and turn(slot), the value of
// the dQ tile's counter at which this key tile adds (the deterministic mode).
struct BwdSlot {
  int h, m;
};
struct BwdWork {
  int j_tile, kv0, hk, b, group, m_first, n_m, n_slots, rot;
  bool descending;
  int64_t kv_head;  // b·Hkv + hk
  ATTNLAB_HOST_DEVICE BwdSlot slot(int s) const {
    const int i = s % n_m, mi = i + rot;
    BwdSlot sl;
    sl.m = descending ? m_first + n_m - 1 - i : m_first + (mi < n_m ? mi : mi - n_m);
    sl.h = hk * group + s / n_m;
    return sl;
  }
  // Every key tile before this one sees the query tile too: key tile j adds j-th.
  ATTNLAB_HOST_DEVICE int turn(const BwdSlot&) const { return j_tile; }
};

template <int Br, int Bc>
ATTNLAB_HOST_DEVICE inline BwdWork bwd_work(const AttnProblem& p, int j_tile, int hk, int b, bool deterministic) {
  BwdWork w;
  w.j_tile = j_tile;
  w.kv0 = j_tile * Bc;
  w.hk = hk;
  w.b = b;
  w.group = p.H / p.kv_heads();
  w.kv_head = int64_t(b) * p.kv_heads() + hk;
  // Query i sees key kv0 iff kv0 <= i + (Nk − Nq) (bottom-right causal).
  const int first_row = p.causal && w.kv0 > p.Nk - p.Nq ? w.kv0 - (p.Nk - p.Nq) : 0;
  const int n_q_tiles = (p.Nq + Br - 1) / Br;
  w.m_first = first_row / Br;
  w.n_m = n_q_tiles > w.m_first ? n_q_tiles - w.m_first : 0;
  w.n_slots = w.n_m * w.group;
  w.rot = !deterministic && w.n_m > 0 ? j_tile % w.n_m : 0;
  w.descending = deterministic;
  return w;
}

// Where a walk's rows sit in the tensors. Dense, these defaults: Q and dO
// read at (m·Br, b·H + h) of their [B·H, Nq, ·] maps, K and V at (kv0, b·Hkv +
// hk); LSE·log2e, Δ and dQ's accumulator per query head in nq_pad rows; dK, dV
// rows of [B·Hkv, Nk, ·]. A walk over a packed batch of sequences
// (kernels/varlen/) overloads them for its own type: the sequence's first
// rows in the packed Q, dO and K, V, its first row in the padded statistics,
// and its dK, dV rows in [total_k, Hkv, ·].
template <typename Work>
ATTNLAB_HOST_DEVICE constexpr int bwd_q_row0(const Work&) { return 0; }
template <typename Work>
ATTNLAB_HOST_DEVICE constexpr int bwd_kv_row0(const Work&) { return 0; }
template <typename Work>
ATTNLAB_HOST_DEVICE constexpr int64_t bwd_stats_row0(const Work&) { return 0; }
template <typename Work>
ATTNLAB_HOST_DEVICE inline int64_t bwd_dkv_row(const AttnProblem& p, const Work& w, int key) {
  return w.kv_head * p.Nk + key;
}

#if defined(__CUDACC__)
// The block's item: blockIdx.x in the order's sections, or with one section
// (bwd_ws_launch's grid is then 2-D) key tile blockIdx.y of KV head
// blockIdx.x, read from the block's indices rather than divided out.
__device__ __forceinline__ BwdItem bwd_block_item(const AttnProblem& p, const BwdOrder& order) {
  if (gridDim.y > 1)
    return {int(blockIdx.y), int(blockIdx.x) % p.kv_heads(), int(blockIdx.x) / p.kv_heads()};
  return bwd_item(p, order, int(blockIdx.x));
}
#endif  // __CUDACC__

}  // namespace attnlab
