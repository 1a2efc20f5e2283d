// attnlab: what a warp does with its query rows held in MMA fragments — the
// pieces every rung from 02 on shares (the split-Q rungs and the Hopper
// engine), and rung 01 the fragment loads, the tile count and the masking:
// the key tiles a query tile needs, the mask on a tile of scores, Q·Kᵀ and
// P·V slices through ldmatrix, P packed for the next MMA, and the epilogue
// that stores O and LSE. A warp owns kMTiles x 16 query rows (kMTiles m16
// row tiles); S, P and O live in mma.m16n8k16 fragments (see ptx.cuh):
//   S: [kMTiles][Bc/8][4] fp32   scores of the warp's rows
//   O: [kMTiles][Dv/8][4] fp32   output accumulator
// Functions that work on one row tile (masking, the epilogue) take S[m], O[m].
// Shared-memory tiles are row-major 16-bit with a row stride of kStride
// elements (the head dim plus padding, so ldmatrix hits 8 different banks).
#pragma once

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/smem_layout.cuh"
#include "host/attn_problem.h"

namespace attnlab {

// How many Bc-wide KV tiles a query tile needs: kv_tiles_for_query_tile
// (host/attn_problem.h, which the host's tile schedulers call too).

// Sets to -inf the scores of keys past Nk and, if causal, keys after a row's
// diagonal (query i sees key j iff j <= i + Nk - Nq). Only tiles that are
// ragged or cross the diagonal pay for it. row0/row1: global query rows of the
// lane's c0,c1 / c2,c3 entries; t = lane % 4.
template <int kTilesS>
__device__ __forceinline__ void mask_scores(float (&S)[kTilesS][4], const AttnProblem& p, int kv_start, int q_start,
                                            int row0, int row1, int t) {
  constexpr int Bc = kTilesS * 8;
  const int causal_offset = p.Nk - p.Nq;
  const bool ragged = kv_start + Bc > p.Nk;
  const bool crosses_diagonal = p.causal && kv_start + Bc - 1 > q_start + causal_offset;
  if (!ragged && !crosses_diagonal) return;
  const int limit0 = p.causal ? min(p.Nk, row0 + causal_offset + 1) : p.Nk;  // keys < limit are visible
  const int limit1 = p.causal ? min(p.Nk, row1 + causal_offset + 1) : p.Nk;
#pragma unroll
  for (int n = 0; n < kTilesS; ++n) {
    const int key = kv_start + n * 8 + 2 * t;
    if (key >= limit0) S[n][0] = -INFINITY;
    if (key + 1 >= limit0) S[n][1] = -INFINITY;
    if (key >= limit1) S[n][2] = -INFINITY;
    if (key + 1 >= limit1) S[n][3] = -INFINITY;
  }
}

// S += Q_warp · K_tileᵀ over one 16-wide slice of the head dim (columns col0 ..
// col0 + 15), for the warp's kMTiles m16 row tiles: every K fragment loaded
// from shared memory feeds kMTiles MMAs, so more row tiles per warp means fewer
// shared-memory reads per MMA. a[m]: the Q fragment of row tile m; sK: the K
// tile, laid out by Layout (smem_layout.cuh).
template <typename T, int kMTiles, int kTilesS, typename Layout>
__device__ __forceinline__ void qk_slice(float (&S)[kMTiles][kTilesS][4], const uint32_t (&a)[kMTiles][4],
                                         const T* sK, int col0, int lane) {
#pragma unroll
  for (int nn = 0; nn < kTilesS / 2; ++nn) {
    uint32_t b[4];  // K rows 16nn .. 16nn+15 (two n8 tiles), 16 columns
    ldmatrix_x4(b, sK + Layout::offset(nn * 16 + (lane / 16) * 8 + lane % 8, col0 + ((lane / 8) % 2) * 8));
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      mma_m16n8k16<T>(S[m][2 * nn], a[m], b[0], b[1]);
      mma_m16n8k16<T>(S[m][2 * nn + 1], a[m], b[2], b[3]);
    }
  }
}

// Padded rows of kStride elements, sK already pointing at the slice's column.
template <typename T, int kMTiles, int kTilesS, int kStride>
__device__ __forceinline__ void qk_slice(float (&S)[kMTiles][kTilesS][4], const uint32_t (&a)[kMTiles][4],
                                         const T* sK, int lane) {
  qk_slice<T, kMTiles, kTilesS, StridedRows<kStride>>(S, a, sK, 0, lane);
}

// One row tile (kMTiles = 1).
template <typename T, int kTilesS, int kStride>
__device__ __forceinline__ void qk_slice(float (&S)[kTilesS][4], const uint32_t (&a)[4], const T* sK, int lane) {
  qk_slice<T, 1, kTilesS, kStride>(reinterpret_cast<float(&)[1][kTilesS][4]>(S),
                                   reinterpret_cast<const uint32_t(&)[1][4]>(a), sK, lane);
}

// The A fragment of rows row0 .. row0+15 x columns col0 .. col0+15 of a shared tile.
template <typename Layout, typename T>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const T* tile, int row0, int col0, int lane) {
  ldmatrix_x4(a, tile + Layout::offset(row0 + lane % 16, col0 + (lane / 16) * 8));
}
// Padded rows of kStride elements, `tile` pointing at the fragment's first element.
template <int kStride, typename T>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const T* tile, int lane) {
  load_a_fragment<StridedRows<kStride>>(a, tile, 0, 0, lane);
}

// O += P · V_tile for the warp's kMTiles row tiles and kTilesO n8 tiles of the
// output (columns col0 ..): P straight from the S registers (as 16-bit A
// operands), V through ldmatrix.trans, each V fragment feeding kMTiles MMAs.
// sV: the V tile, laid out by Layout.
template <typename T, int kMTiles, int kTilesS, int kTilesO, typename Layout>
__device__ __forceinline__ void pv_tile(float (&O)[kMTiles][kTilesO][4], const float (&P)[kMTiles][kTilesS][4],
                                        const T* sV, int col0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTilesS / 2; ++kk) {
    uint32_t a[kMTiles][4];  // P[:, 16kk .. 16kk+15]: S tiles 2kk and 2kk+1
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      a[m][0] = pack2<T>(P[m][2 * kk][0], P[m][2 * kk][1]);
      a[m][1] = pack2<T>(P[m][2 * kk][2], P[m][2 * kk][3]);
      a[m][2] = pack2<T>(P[m][2 * kk + 1][0], P[m][2 * kk + 1][1]);
      a[m][3] = pack2<T>(P[m][2 * kk + 1][2], P[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int nd = 0; nd < kTilesO / 2; ++nd) {
      uint32_t b[4];  // V rows 16kk .. 16kk+15, columns 16nd .. 16nd+15, transposed
      ldmatrix_x4_trans(b, sV + Layout::offset(kk * 16 + lane % 16, col0 + nd * 16 + (lane / 16) * 8));
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        mma_m16n8k16<T>(O[m][2 * nd], a[m], b[0], b[1]);
        mma_m16n8k16<T>(O[m][2 * nd + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// Padded rows of kStride elements, sV already pointing at the first column.
template <typename T, int kMTiles, int kTilesS, int kTilesO, int kStride>
__device__ __forceinline__ void pv_tile(float (&O)[kMTiles][kTilesO][4], const float (&P)[kMTiles][kTilesS][4],
                                        const T* sV, int lane) {
  pv_tile<T, kMTiles, kTilesS, kTilesO, StridedRows<kStride>>(O, P, sV, 0, lane);
}

// One row tile (kMTiles = 1).
template <typename T, int kTilesS, int kTilesO, int kStride>
__device__ __forceinline__ void pv_tile(float (&O)[kTilesO][4], const float (&P)[kTilesS][4], const T* sV, int lane) {
  pv_tile<T, 1, kTilesS, kTilesO, kStride>(reinterpret_cast<float(&)[1][kTilesO][4]>(O),
                                           reinterpret_cast<const float(&)[1][kTilesS][4]>(P), sV, lane);
}

// Epilogue: O_i / l_i and LSE_i of the rows row0, row0 + 8 of one head, written
// where a row is below n_rows: O row r at Og + r·o_row_stride (elements), its
// LSE at lse_head[r] (natural log). `col0` is the first output column this
// warp owns (0 unless warps split the head dim); `write_lse` false for all but
// one of the warps that share rows.
template <typename T, int kTilesO>
__device__ __forceinline__ void store_output_rows(float (&O)[kTilesO][4], RowStats& stats, float scale, int n_rows,
                                                  int row0, int col0, int t, bool write_lse, T* Og,
                                                  int64_t o_row_stride, float* lse_head) {
  float row_lse[2];
  online_softmax_finalize(O, stats, scale, row_lse);
  const int rows[2] = {row0, row0 + 8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= n_rows) continue;
#pragma unroll
    for (int n = 0; n < kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(Og + int64_t(rows[r]) * o_row_stride + col0 + n * 8 + 2 * t) =
          pack2<T>(O[n][2 * r], O[n][2 * r + 1]);
    if (write_lse && t == 0) lse_head[rows[r]] = row_lse[r];
  }
}

// The same for head `head` of the dense O [B·H, Nq, Dv] and LSE [B·H, Nq]. (Its
// own body, not a call of store_output_rows: so routed, the block-sparse
// forward at D = 64 spills 12 bytes, its pointers held across the finalize.)
template <typename T, int kTilesO>
__device__ __forceinline__ void store_output(float (&O)[kTilesO][4], RowStats& stats, const AttnProblem& p,
                                             int64_t head, int row0, int col0, int t, bool write_lse, T* o,
                                             float* lse) {
  float row_lse[2];
  online_softmax_finalize(O, stats, p.scale, row_lse);
  T* Og = o + head * p.Nq * p.Dv;
  const int rows[2] = {row0, row0 + 8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= p.Nq) continue;
#pragma unroll
    for (int n = 0; n < kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(Og + int64_t(rows[r]) * p.Dv + col0 + n * 8 + 2 * t) =
          pack2<T>(O[n][2 * r], O[n][2 * r + 1]);
    if (write_lse && t == 0) lse[head * p.Nq + rows[r]] = row_lse[r];
  }
}

// S = the sum of the kWarpsD partial S of a row group (rungs 05, 06: warps that
// split the head dim each hold S over their share of D). Each warp stores its
// partial to sRed ([kWarps][kTilesS · 32 lanes] float4, fragment order), meets
// the row group at named barrier 1 + wm, and adds the partials in the same order
// (wd = 0, 1, ...): every warp of the group ends with bit-identical S, hence
// identical m_i, l_i and P, and no statistics need exchanging afterwards. The
// caller must not rewrite sRed before a later block-wide barrier.
template <int kTilesS, int kWarpsM, int kWarpsD>
__device__ __forceinline__ void sum_partial_scores(float (&S)[kTilesS][4], float* sRed, int warp, int wm, int wd,
                                                   int lane) {
  float* mine = sRed + (warp * kTilesS * 32 + lane) * 4;
#pragma unroll
  for (int n = 0; n < kTilesS; ++n)
    *reinterpret_cast<float4*>(mine + n * 32 * 4) = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
  named_barrier_sync(1 + wm, kWarpsD * 32);  // the row group's partials are written
#pragma unroll
  for (int n = 0; n < kTilesS; ++n) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < kWarpsD; ++i) {
      float4 part;
      if (i == wd) part = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
      else part = *reinterpret_cast<const float4*>(sRed + (((wm + i * kWarpsM) * kTilesS + n) * 32 + lane) * 4);
      if (i == 0) sum = part;
      else sum = make_float4(sum.x + part.x, sum.y + part.y, sum.z + part.z, sum.w + part.w);
    }
    S[n][0] = sum.x, S[n][1] = sum.y, S[n][2] = sum.z, S[n][3] = sum.w;
  }
}

// P (the S registers after the softmax) as 16-bit A fragments: k16 step kk of
// the Bc keys in P[kk] (S tiles 2kk and 2kk+1).
template <typename T, int kTilesS>
__device__ __forceinline__ void pack_p_fragments(uint32_t (&P)[kTilesS / 2][4], const float (&S)[kTilesS][4]) {
#pragma unroll
  for (int kk = 0; kk < kTilesS / 2; ++kk) {
    P[kk][0] = pack2<T>(S[2 * kk][0], S[2 * kk][1]);
    P[kk][1] = pack2<T>(S[2 * kk][2], S[2 * kk][3]);
    P[kk][2] = pack2<T>(S[2 * kk + 1][0], S[2 * kk + 1][1]);
    P[kk][3] = pack2<T>(S[2 * kk + 1][2], S[2 * kk + 1][3]);
  }
}

// Epilogue for warps that own a strided share of the head dim (rungs 05, 06):
// in each of kSlices slices of kSliceCols columns, the warp holds the
// kTilesPerSlice n8 tiles starting at column col0. O[s·kTilesPerSlice + n] is
// tile n of slice s. Rows past Nq and columns at or past D are not written;
// `write_lse` for one warp of the row group only.
template <typename T, int kSlices, int kTilesPerSlice, int kSliceCols>
__device__ __forceinline__ void store_output_sliced(float (&O)[kSlices * kTilesPerSlice][4], RowStats& stats,
                                                    const AttnProblem& p, int D, int64_t head, int row0, int col0,
                                                    int t, bool write_lse, T* o, float* lse) {
  float row_lse[2];
  online_softmax_finalize(O, stats, p.scale, row_lse);
  T* Og = o + head * p.Nq * D;
  const int rows[2] = {row0, row0 + 8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= p.Nq) continue;
#pragma unroll
    for (int s = 0; s < kSlices; ++s)
#pragma unroll
      for (int n = 0; n < kTilesPerSlice; ++n) {
        const int col = s * kSliceCols + col0 + n * 8;
        if (col < D)
          *reinterpret_cast<uint32_t*>(Og + int64_t(rows[r]) * D + col + 2 * t) =
              pack2<T>(O[s * kTilesPerSlice + n][2 * r], O[s * kTilesPerSlice + n][2 * r + 1]);
      }
    if (write_lse && t == 0) lse[head * p.Nq + rows[r]] = row_lse[r];
  }
}

}  // namespace attnlab
