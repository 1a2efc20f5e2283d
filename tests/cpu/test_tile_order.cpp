// Rung 12's tile order (kernels/flash_attn/tile_order.cuh): every (query tile,
// head) work item exactly once, longest first under a causal mask, and a
// persistent grid's rounds dealing out each item exactly once.
#include <set>
#include <utility>
#include <vector>

#include "flash_attn/tile_order.cuh"
#include "testing.h"

using namespace attnlab;

namespace {
TileOrder order(int m_blocks, int heads, int section) {
  TileOrder t;
  t.m_blocks = m_blocks;
  t.heads = heads;
  t.section = section;
  t.items = m_blocks * heads;
  return t;
}
}  // namespace

TEST_CASE(tile_order_visits_every_item_once) {
  for (int m_blocks : {1, 7, 64})
    for (int heads : {1, 3, 8, 13})
      for (int section : {0, 1, 2, 4, 8, 13}) {
        if (section > heads) continue;
        const TileOrder t = order(m_blocks, heads, section);
        std::set<std::pair<int, int>> seen;
        for (int linear = 0; linear < t.items; ++linear) {
          int m = -1, h = -1;
          t.item(linear, m, h);
          EXPECT_TRUE(m >= 0 && m < m_blocks && h >= 0 && h < heads);
          seen.insert({m, h});
        }
        EXPECT_EQ(int(seen.size()), t.items);
      }
}

TEST_CASE(tile_order_causal_sections_go_longest_first) {
  // Inside a section, the query tile never grows along the order: tile row m of
  // every head of the section before row m - 1 of any.
  const TileOrder t = order(64, 8, 3);  // sections of 3, 3 and 2 heads
  int last_m = 1 << 30, last_first_head = -1;
  for (int linear = 0; linear < t.items; ++linear) {
    int m, h;
    t.item(linear, m, h);
    const int first_head = h / 3 * 3;
    if (first_head != last_first_head) last_m = 1 << 30, last_first_head = first_head;
    EXPECT_TRUE(m <= last_m);
    last_m = m;
  }
  int m, h;
  t.item(0, m, h);
  EXPECT_EQ(m, 63);  // the longest tile starts first
  EXPECT_EQ(h, 0);
}

TEST_CASE(tile_order_persistent_rounds_deal_each_item_once) {
  for (int items : {1, 131, 132, 133, 344, 512})
    for (int blocks : {1, 5, 132}) {
      const TileOrder t = order(items, 1, 0);
      std::vector<int> dealt(size_t(items), 0);
      for (int b = 0; b < blocks; ++b)
        for (int round = 0, linear; (linear = t.next(b, blocks, round)) >= 0; ++round) ++dealt[size_t(linear)];
      bool once = true;
      for (int n : dealt) once = once && n == 1;
      EXPECT_TRUE(once);
    }
  // One block per item: one round each, item = block.
  const TileOrder t = order(10, 3, 0);
  for (int b = 0; b < t.items; ++b) {
    EXPECT_EQ(t.next(b, t.items, 0), b);
    EXPECT_EQ(t.next(b, t.items, 1), -1);
  }
}

TEST_CASE(tile_order_equal_sections) {
  AttnProblem p;
  p.B = 1;
  p.H = 8;
  p.Nq = p.Nk = 8192;
  p.D = p.Dv = 128;
  p.causal = true;
  const TileOrder t = make_tile_order(p, 128);
  EXPECT_TRUE(t.section >= 1 && t.section <= 8);
  // Equal sections: the last is at most one head short of the others.
  const int sections = (8 + t.section - 1) / t.section;
  EXPECT_TRUE(8 - (sections - 1) * t.section >= t.section - 1);
  p.causal = false;
  EXPECT_EQ(make_tile_order(p, 128).section, 0);
  EXPECT_EQ(make_tile_order(p, 128).items, 64 * 8);
}
