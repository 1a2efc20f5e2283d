// The Hopper backward's block order (kernels/hopper/bwd_scheduler.h):
// every (key tile, KV head) item exactly once, whole sections of KV heads one
// after the other with key tile 0 first in each, section sizes that differ by
// at most one, and the section sizes bwd_order picks.
#include <set>
#include <tuple>

#include "hopper/bwd_scheduler.h"
#include "testing.h"

using namespace attnlab;

namespace {
AttnProblem problem(int B, int H, int Hkv, int N, int D, bool causal) {
  AttnProblem p;
  p.B = B, p.H = H, p.Hkv = Hkv, p.Nq = p.Nk = N, p.D = p.Dv = D, p.causal = causal;
  return p;
}
BwdOrder sections(int n_k, int heads, int per) {
  BwdOrder o;
  o.n_k = n_k;
  const int count = (heads + per - 1) / per;
  o.base = heads / count, o.extra = heads % count;
  return o;
}
}  // namespace

TEST_CASE(bwd_order_visits_every_item_once_section_by_section) {
  // The expected order, written out: section by section (sizes base + 1 for
  // the first `extra`, then base), inside one key tile by key tile, each over
  // the section's heads.
  for (int B : {1, 3})
    for (int Hkv : {1, 5, 8})
      for (int n_k : {1, 7, 32})
        for (int per : {1, 2, 3, 8, 40}) {
          const AttnProblem p = problem(B, 2 * Hkv, Hkv, n_k * 128, 128, true);
          const int heads = B * Hkv;
          const BwdOrder o = sections(n_k, heads, per > heads ? heads : per);
          EXPECT_EQ(bwd_items(p, o), int64_t(heads) * n_k);
          std::set<std::tuple<int, int, int>> seen;
          int item = 0;
          for (int first = 0, s = 0; first < heads; ++s) {
            const int size = o.base + (s < o.extra ? 1 : 0);
            EXPECT_TRUE(size >= 1);
            for (int j = 0; j < n_k; ++j)
              for (int x = first; x < first + size; ++x, ++item) {
                const BwdItem it = bwd_item(p, o, item);
                EXPECT_EQ(it.j_tile, j);
                EXPECT_EQ(it.b * Hkv + it.hk, x);
                EXPECT_TRUE(it.hk < Hkv && it.b < B);
                seen.insert({it.j_tile, it.hk, it.b});
              }
            first += size;
          }
          EXPECT_EQ(item, heads * n_k);
          EXPECT_EQ(int64_t(seen.size()), int64_t(heads) * n_k);
        }
}

TEST_CASE(bwd_order_one_section_is_key_tile_major) {
  // One section (ATTNLAB_BWD_NO_SECTIONS): item j·heads + x is key tile j of head x.
  const AttnProblem p = problem(2, 6, 3, 1000, 64, false);
  const int heads = 6, n_k = 8;
  const BwdOrder o = bwd_order(p, 128, true, true, 50 << 20, 132);
  EXPECT_EQ(o.base, heads);
  EXPECT_EQ(o.extra, 0);
  for (int item = 0; item < heads * n_k; ++item) {
    const BwdItem it = bwd_item(p, o, item);
    EXPECT_EQ(it.j_tile, item / heads);
    EXPECT_EQ(it.b * 3 + it.hk, item % heads);
  }
}

TEST_CASE(bwd_order_section_sizes) {
  const int64_t l2 = int64_t(50) << 20;
  // Causal B4 H16 N4096 D128: 4 MB of Q, dO and dQ's accumulator a head, 6 in half the L2, but a
  // section must outlast its longest walk: 2·132 / 32 key tiles -> 9 heads at least: 8 sections of 8.
  BwdOrder o = bwd_order(problem(4, 16, 16, 4096, 128, true), 128, true, false, l2, 132);
  EXPECT_EQ(o.n_k, 32);
  EXPECT_EQ(o.base, 8);
  EXPECT_EQ(o.extra, 0);
  // Causal B1 H32/8 N8192 D128: a KV head's 4 query heads, 32 MB: one KV head fits; 2·132 / 64 -> 5.
  o = bwd_order(problem(1, 32, 8, 8192, 128, true), 128, true, false, l2, 132);
  EXPECT_EQ(o.base, 4);  // 2 sections of 4 (5 would leave a last section of 3)
  EXPECT_EQ(o.extra, 0);
  // Not causal: one KV head a section.
  o = bwd_order(problem(4, 16, 16, 4096, 128, false), 128, false, false, l2, 132);
  EXPECT_EQ(o.base, 1);
  EXPECT_EQ(o.extra, 0);
  // Few heads: one section of them all.
  o = bwd_order(problem(1, 2, 2, 300, 64, true), 128, true, false, l2, 132);
  EXPECT_EQ(o.base, 2);
  EXPECT_EQ(o.extra, 0);
  // The deterministic mode: sections only where there are more than three (B4 H16: 8 of 8 heads;
  // B1 H32/8: 2 would be, so one; not causal: one).
  o = bwd_order(problem(4, 16, 16, 4096, 128, true), 128, true, false, l2, 132, true);
  EXPECT_EQ(o.base, 8);
  EXPECT_TRUE(!bwd_one_section(problem(4, 16, 16, 4096, 128, true), o));
  o = bwd_order(problem(1, 32, 8, 8192, 128, true), 128, true, false, l2, 132, true);
  EXPECT_EQ(o.base, 8);
  EXPECT_EQ(o.extra, 0);
  EXPECT_TRUE(bwd_one_section(problem(1, 32, 8, 8192, 128, true), o));
  o = bwd_order(problem(4, 16, 16, 4096, 128, false), 128, false, false, l2, 132, true);
  EXPECT_EQ(o.base, 64);
  EXPECT_TRUE(bwd_one_section(problem(4, 16, 16, 4096, 128, false), o));
  // 10 heads in sections of at most 3: 4 sections, of 3, 3, 2, 2.
  o = sections(4, 10, 3);
  EXPECT_EQ(o.base, 2);
  EXPECT_EQ(o.extra, 2);
}

TEST_CASE(bwd_grid_is_two_dimensional_for_one_section) {
  const int64_t l2 = int64_t(50) << 20;
  // One section of every KV head: (B·Hkv, key tiles), the key tile from blockIdx.y.
  const AttnProblem one = problem(1, 32, 8, 8192, 128, true);
  BwdOrder o = bwd_order(one, 128, true, false, l2, 132, true);
  dim3 g = bwd_grid(one, o);
  EXPECT_EQ(int(g.x), 8);
  EXPECT_EQ(int(g.y), 64);
  // Several sections: the items in a row, as many as bwd_items counts.
  const AttnProblem many = problem(4, 16, 16, 4096, 128, true);
  o = bwd_order(many, 128, true, false, l2, 132);
  g = bwd_grid(many, o);
  EXPECT_EQ(int64_t(g.x), bwd_items(many, o));
  EXPECT_EQ(int(g.y), 1);
}
