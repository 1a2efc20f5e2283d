// kernels/varlen/: attention over a packed batch of sequences of different lengths on the
// Hopper engine (kernels/hopper/), in FlashAttention's varlen layout.
// attnlab: the variable-length forward's work order, which the host (tests,
// the harness's expectations) and the device (varlen_prepare.cuh) compute alike.
//
// A work item is one (query tile, head) of one sequence; it costs about as many
// key tiles as it visits, which differ from sequence to sequence (and, causal,
// from tile to tile). A persistent grid takes the items from a counter longest
// first (rung 12's dynamic order, FlashAttention-3's LPT), so that one long
// sequence among short ones starts first and no SM waits on it at the end.
// The order: the query tiles (sequence b, tile m) of every sequence sorted by
// their key-tile count, descending (counts of kTopBucket and more tie), ties in
// (b, m) order, so that the tiles of one sequence stay together and reuse its K
// and V from L2; each tile's H heads one after the other (GQA: the heads that
// share a KV head are neighbours). Item i is tile i / H, head i % H.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "host/attn_problem.h"

namespace attnlab {

// Sequence b of a packed batch: its query rows [q0, q0 + len_q) and key rows
// [k0, k0 + len_k) of the packed tensors. cu_seqlens are clamped into the
// tensors (a malformed offset never reaches outside them; the host checks the
// offsets before a launch, varlen_lengths_invalid).
struct VarlenSeq {
  int q0, len_q, k0, len_k;
};
ATTNLAB_HOST_DEVICE inline VarlenSeq varlen_seq(const int* cu_q, const int* cu_k, int b, int total_q, int total_k) {
  auto clamp = [](int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); };
  VarlenSeq s;
  s.q0 = clamp(cu_q[b], 0, total_q);
  s.len_q = clamp(cu_q[b + 1], s.q0, total_q) - s.q0;
  s.k0 = clamp(cu_k[b], 0, total_k);
  s.len_k = clamp(cu_k[b + 1], s.k0, total_k) - s.k0;
  return s;
}

// Sequence s as a problem of one batch: its lengths, p's heads, dims, mask and scale.
ATTNLAB_HOST_DEVICE inline AttnProblem varlen_seq_problem(const AttnProblem& p, const VarlenSeq& s) {
  AttnProblem q = p;
  q.B = 1;
  q.Nq = s.len_q;
  q.Nk = s.len_k;
  return q;
}

// The two orders over a packed batch's tiles: the forward's items are query
// tiles, each costing the key tiles it visits; the backward's are key tiles
// (hopper/bwd_scheduler.h's walk), each costing the query tiles that see it.
enum class VarlenTiles { kQuery, kKey };

// Sequence s's tiles of that kind: query tiles of Br rows, or key tiles of Bc.
ATTNLAB_HOST_DEVICE inline int varlen_tile_count(VarlenTiles kind, const VarlenSeq& s, int Br, int Bc) {
  return kind == VarlenTiles::kQuery ? (s.len_q + Br - 1) / Br : (s.len_k + Bc - 1) / Bc;
}

// Counts of kTopBucket and more share the first place of the order.
constexpr int kVarlenTopBucket = 2046;

// The sort key of tile t of sequence s: what it costs, capped. A query tile
// visits kv_tiles_for_query_tile key tiles; key tile t is seen by the query
// tiles from the one holding its first visible row (bottom-right causal: key
// j is seen by queries i >= j − (len_k − len_q)) to the last, as bwd_work
// counts them.
ATTNLAB_HOST_DEVICE inline int varlen_tile_bucket(VarlenTiles kind, const AttnProblem& p, const VarlenSeq& s, int t,
                                                  int Br, int Bc) {
  const AttnProblem q = varlen_seq_problem(p, s);
  int work;
  if (kind == VarlenTiles::kQuery) {
    work = kv_tiles_for_query_tile(q, t * Br, Br, Bc);
  } else {
    const int kv0 = t * Bc, diag = q.Nk - q.Nq;
    const int first_row = q.causal && kv0 > diag ? kv0 - diag : 0;
    const int n_m = (q.Nq + Br - 1) / Br - first_row / Br;
    work = n_m > 0 ? n_m : 0;
  }
  return work < kVarlenTopBucket ? work : kVarlenTopBucket;
}

// One tile of an order: its sequence and its index in the sequence.
struct VarlenTile {
  int seq, tile;
};

// The order of problem p's tiles of `kind` for Br x Bc tiles (p: heads,
// dims, mask; B sequences given by cu_q, cu_k over total_q, total_k rows), as
// the device computes it (varlen_prepare.cuh): by cost, descending, ties in
// (sequence, tile) order. The host's copy: tests compare the device's with it.
inline std::vector<VarlenTile> varlen_tile_order(VarlenTiles kind, const AttnProblem& p, const int* cu_q,
                                                 const int* cu_k, int B, int total_q, int total_k, int Br, int Bc) {
  std::vector<std::vector<VarlenTile>> by_bucket(kVarlenTopBucket + 1);
  for (int b = 0; b < B; ++b) {
    const VarlenSeq s = varlen_seq(cu_q, cu_k, b, total_q, total_k);
    for (int t = 0; t < varlen_tile_count(kind, s, Br, Bc); ++t)
      by_bucket[varlen_tile_bucket(kind, p, s, t, Br, Bc)].push_back({b, t});
  }
  std::vector<VarlenTile> order;
  for (int w = kVarlenTopBucket; w >= 0; --w) order.insert(order.end(), by_bucket[w].begin(), by_bucket[w].end());
  return order;
}

// The most tiles of `rows` rows a packed batch of B sequences over `total`
// rows can have: Σ ceil(len_b / rows) <= total / rows + B.
inline int64_t varlen_max_tiles(int64_t total, int B, int rows) { return total / rows + B; }

// The order's workspace (forward or backward), 256-byte aligned pieces: the
// header (the item counter, the item count), the sequences' first tile
// [B + 1], the order [max tiles].
struct VarlenWorkspace {
  int* counter = nullptr;    // items taken after round 0 (hopper/fwd_scheduler.cuh)
  int* n_items = nullptr;    // tiles · heads (the forward's H, the backward's Hkv)
  int* tile_start = nullptr; // [B + 1]: sequence b's tiles are [tile_start[b], tile_start[b + 1])
  VarlenTile* tiles = nullptr;  // [max tiles]: the order

  static size_t align(size_t n) { return (n + 255) / 256 * 256; }
  static size_t bytes(int B, int64_t max_tiles) {
    return align(16) + align(sizeof(int) * (size_t(B) + 1)) + align(sizeof(VarlenTile) * size_t(max_tiles));
  }
  static VarlenWorkspace at(void* base, int B) {
    VarlenWorkspace w;
    char* p = static_cast<char*>(base);
    w.counter = reinterpret_cast<int*>(p);
    w.n_items = w.counter + 1;
    p += align(16);
    w.tile_start = reinterpret_cast<int*>(p);
    p += align(sizeof(int) * (size_t(B) + 1));
    w.tiles = reinterpret_cast<VarlenTile*>(p);
    return w;
  }
};

}  // namespace attnlab
