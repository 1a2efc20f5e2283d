// attnlab: the block-sparse backward's tile scheduler — which query tiles the
// block of one key tile visits, in what order, and at which turn each of its
// dQ adds goes in the deterministic mode. Rung 14's walk (BwdWork,
// hopper/bwd_mainloop.cuh) with the block mask's transposed lists in
// place of the causal band, as flash_attn/cute's flash_bwd_sm100.py walks
// them (get_m_block_from_iter_bwd). The grid is rung 14's: one block per
// (key tile, KV head and batch), in L2-sized sections of heads as a causal
// walk's (bwd_item: a block mask's walks differ in length).
//
// Key tile j (keys j·Bc ..) lies in key block n = j / f, f = block_kv / Bc.
// For each query head h of the KV head's group (GQA: dK, dV sum over them):
// the query blocks that see n, its full list and then its partial list, each
// from its largest block down, each block expanded into fq = block_q / Br
// query tiles, largest first; tiles past Nq (of the last query block) are
// left out. Full before partial, largest first: under a causal mask the full
// blocks lie below the diagonal block, so every key tile meets the dQ tiles
// from the last one down, the order the deterministic turns want (below).
// Without them, each head's walk starts at a slot rotated by j (rung 14's
// rotation), so that key tiles running side by side add into different dQ tiles.
#pragma once

#include <cstdint>

#include "hopper/bwd_scheduler.h"
#include "host/attn_problem.h"

namespace attnlab {

// The block mask as the backward reads it (block_mask.h's layout): per (b, h,
// key block n) the partial and full query blocks that see it, and, for the
// deterministic turns, the rank of each entry (blocksparse_bwd.cu's pre-pass). B or H may be 1:
// the same lists for every batch or head.
struct BlockSparseBwdLists {
  const int32_t* q_count = nullptr;       // [B][H][n_blocks]
  const int32_t* q_index = nullptr;       // [B][H][n_blocks][m_blocks], ascending
  const int32_t* full_q_count = nullptr;
  const int32_t* full_q_index = nullptr;
  const int32_t* q_rank = nullptr;        // [B][H][n_blocks][m_blocks], beside q_index
  const int32_t* full_q_rank = nullptr;
  int B = 1, H = 1, m_blocks = 0, n_blocks = 0;
  int q_tiles_per_block = 1;   // fq = block_q / Br
  int kv_tiles_per_block = 1;  // f = block_kv / Bc
  // The list row of batch b, query head h (of the batch); B·H·n_blocks·m_blocks
  // < 2^31 (blocksparse_bwd_unsupported), so list offsets are ints.
  ATTNLAB_HOST_DEVICE int head_row(int b, int h) const { return (B == 1 ? 0 : b) * H + (H == 1 ? 0 : h); }
};

struct BsBwdSlot {
  int h, m;      // query head (in the batch), query tile
  bool partial;  // from the partial list: the mask_mod applies
  int entry;     // its query block's place in the list arrays
};

// How many of the first `count` entries of an ascending list are below n.
__device__ __forceinline__ int count_below(const int32_t* list, int count, int n) {
  int lo = 0, hi = count;
#pragma unroll 1
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (list[mid] < n) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// One key tile's walk, a walk in hopper/bwd_mainloop.cuh's sense. slot(s) keeps a
// cursor (the head g whose slots are first .. end - 1), so s must not decrease
// between calls; each role walks its own copy. Head g's slot i (after the
// rotation) is the full list's tile full_tiles - 1 - i, counted in ascending
// order over the list's blocks, or else the partial list's tile end - first - 1 - i.
struct BsBwdWork {
  int j_tile, kv0, hk, b, group, n_slots;
  int64_t kv_head;  // b·Hkv + hk
  BlockSparseBwdLists lists;
  int n_block;    // the key block of this key tile
  int last_skip;  // query tiles of the last query block past Nq
  bool rotate;
  int g, first, end;  // the cursor's head and its slots
  int full_tiles;     // its full list's query tiles (past Nq left out)
  int rot;            // its walk's rotation
  int row;            // its lists' row: head_row·n_blocks + n_block

  // Head g's lists into the cursor; returns its slots.
  __device__ __forceinline__ int load_head(int head_g) {
    const int fq = lists.q_tiles_per_block, last = lists.m_blocks - 1;
    g = head_g;
    row = lists.head_row(b, hk * group + g) * lists.n_blocks + n_block;
    // A list's tiles, less the last query block's tiles past Nq when it holds that block (its largest).
    auto tiles_of = [&](const int32_t* count, const int32_t* index) {
      const int c = count[row];
      return c * fq - (last_skip > 0 && c > 0 && index[row * lists.m_blocks + c - 1] == last ? last_skip : 0);
    };
    full_tiles = tiles_of(lists.full_q_count, lists.full_q_index);
    const int tiles = full_tiles + tiles_of(lists.q_count, lists.q_index);
    rot = rotate && tiles > 0 ? j_tile % tiles : 0;
    end = first + tiles;
    return tiles;
  }

  __device__ __forceinline__ BsBwdSlot slot(int s) {
#pragma unroll 1
    while (s >= end) {  // the heads before s's (a head may have no slot)
      first = end;
      load_head(g + 1);
    }
    const int fq = lists.q_tiles_per_block, tiles = end - first;
    int i = s - first + rot;
    if (i >= tiles) i -= tiles;
    const bool in_full = i < full_tiles;
    const int u = (in_full ? full_tiles : tiles) - 1 - i;  // the tile's place in its list, ascending
    BsBwdSlot sl;
    sl.entry = row * lists.m_blocks + u / fq;
    sl.h = hk * group + g;
    sl.m = (in_full ? lists.full_q_index : lists.q_index)[sl.entry] * fq + u % fq;
    sl.partial = !in_full;
    return sl;
  }

  // The deterministic order of the adds to a dQ tile (h, m) of query block
  // M = m / fq: its adders are the key tiles of the key blocks that M's
  // forward lists name (partial and full), and they add in ascending key-tile
  // order. Key tile j of key block n is the (c·f + j % f)-th, c = the listed
  // key blocks below n (every block below the last has all f of its tiles),
  // which a pre-pass stored beside the list entry (blocksparse_bwd.cu). Every adder it
  // waits for has a smaller j: a block of the same KV head earlier in the grid
  // (blocks start in grid order), which itself waits only for smaller ones —
  // no cycle, so no hang, for any valid block mask (its forward and transposed
  // lists agreeing: block_mask_invalid).
  __device__ __forceinline__ int turn(const BsBwdSlot& sl) const {
    const int f = lists.kv_tiles_per_block;
    return (sl.partial ? lists.q_rank : lists.full_q_rank)[sl.entry] * f + (j_tile - n_block * f);
  }
};

// The walk of key tile j_tile (of Bc keys) of KV head hk, batch b, over query tiles of Br rows.
__device__ __forceinline__ BsBwdWork bs_bwd_work(const BlockSparseBwdLists& lists, const AttnProblem& p, int Br,
                                                 int Bc, int j_tile, int hk, int b, bool deterministic) {
  BsBwdWork w;
  w.j_tile = j_tile;
  w.kv0 = j_tile * Bc;
  w.hk = hk;
  w.b = b;
  w.group = p.H / p.kv_heads();
  w.kv_head = int64_t(b) * p.kv_heads() + hk;
  w.lists = lists;
  w.n_block = j_tile / lists.kv_tiles_per_block;
  w.last_skip = lists.m_blocks * lists.q_tiles_per_block - (p.Nq + Br - 1) / Br;
  w.rotate = !deterministic;
  // n_slots over the group's heads (one head's lists when they are shared), then the cursor at head 0.
  w.first = 0;
  int n = 0;
  if (lists.H == 1) {
    n = w.group * w.load_head(0);
  } else {
#pragma unroll 1
    for (int g = w.group - 1; g >= 0; --g) n += w.load_head(g);
  }
  w.n_slots = n;
  w.load_head(0);
  return w;
}

}  // namespace attnlab
