// The forward tile scheduler (kernels/hopper/fwd_scheduler.h): every (query
// tile, head) work item exactly once, longest first under that policy, a
// persistent grid's rounds dealing out each item exactly once, and the plan's
// grid and workspace for each policy; rung 12's steps, registered on request.
#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "hopper/fwd_scheduler.h"
#include "host/variant.h"
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

TEST_CASE(tile_order_sections_go_longest_first) {
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
  const TileOrder t = make_tile_order(p, 128, FwdPolicy::kLongestFirst);
  EXPECT_TRUE(t.section >= 1 && t.section <= 8);
  // Equal sections: the last is at most one head short of the others.
  const int sections = (8 + t.section - 1) / t.section;
  EXPECT_TRUE(8 - (sections - 1) * t.section >= t.section - 1);
  EXPECT_EQ(make_tile_order(p, 128, FwdPolicy::kHeadByHead).section, 0);
  EXPECT_EQ(make_tile_order(p, 128, FwdPolicy::kHeadByHead).items, 64 * 8);
  // The order is the policy's, whatever the mask: the problem's causal flag plays no part.
  p.causal = true;
  EXPECT_EQ(make_tile_order(p, 128, FwdPolicy::kLongestFirst).section, t.section);
  EXPECT_EQ(make_tile_order(p, 128, FwdPolicy::kHeadByHead).section, 0);
}

// The plan's grid and workspace: head by head, a persistent grid of one block
// per SM (split where the workspace holds the partial states); longest first
// without a counter, a block per item; a kernel of one item per block, a block
// per item under either policy.
TEST_CASE(fwd_schedule_plans_the_grid_of_each_policy) {
  AttnProblem p;
  p.B = 1;
  p.H = 8;
  p.Nq = p.Nk = 8192;
  p.D = p.Dv = 128;
  const FwdTiles tiles{128, 176, 256, 16};
  const int sms = 132;
  FwdSchedule s;
  EXPECT_EQ(plan_fwd_schedule(p, FwdPolicy::kHeadByHead, tiles, true, nullptr, 0, sms, nullptr, s), cudaSuccess);
  EXPECT_EQ(s.blocks, sms);  // 512 equal items, dealt round by round
  EXPECT_EQ(s.order.split_units, 0);  // no workspace: no split
  EXPECT_TRUE(s.counter == nullptr && !s.order.dynamic);
  std::vector<unsigned char> workspace(fwd_schedule_workspace_bytes(FwdPolicy::kHeadByHead, tiles, sms));
  EXPECT_EQ(workspace.size(), kv_split_workspace_bytes(sms, tiles.threads, tiles.tiles_o));
  EXPECT_EQ(plan_fwd_schedule(p, FwdPolicy::kHeadByHead, tiles, true, workspace.data(), workspace.size(), sms,
                              nullptr, s),
            cudaSuccess);
  EXPECT_EQ(s.blocks, sms);
  EXPECT_TRUE(s.order.split_units > 0 && s.split.flags != nullptr);  // 512 = 3·132 + 116: the last round split
  EXPECT_EQ(plan_fwd_schedule(p, FwdPolicy::kLongestFirst, tiles, true, nullptr, 0, sms, nullptr, s), cudaSuccess);
  EXPECT_EQ(s.blocks, 512);
  EXPECT_TRUE(s.counter == nullptr && !s.order.dynamic);
  EXPECT_EQ(fwd_schedule_workspace_bytes(FwdPolicy::kLongestFirst, tiles, sms), kDynamicCounterBytes);
  for (FwdPolicy policy : {FwdPolicy::kHeadByHead, FwdPolicy::kLongestFirst}) {
    EXPECT_EQ(plan_fwd_schedule(p, policy, tiles, false, workspace.data(), workspace.size(), sms, nullptr, s),
              cudaSuccess);
    EXPECT_EQ(s.blocks, 512);
    EXPECT_EQ(s.order.split_units, 0);
  }
}

// The split of a non-causal grid's last round along the keys: every key tile
// of every item computed exactly once; a block leaves at most one partial
// state and leaves it before it waits for any; the block that ends a split
// item merges exactly the partials of that item, each from a lower block,
// found by the walk the kernel does (hopper/fwd_mainloop.cuh).
TEST_CASE(tile_order_split_covers_every_key_tile_once) {
  int splits = 0;
  for (int items : {1, 2, 5, 44, 131, 132, 133, 200, 344, 512, 1000})
    for (int kv_tiles : {1, 2, 3, 6, 47, 64})
      for (int sms : {1, 7, 132}) {
        TileOrder t = order(items, 1, 0);
        const int blocks = plan_kv_split(t, kv_tiles, sms, true);
        EXPECT_TRUE(blocks >= 1 && blocks <= sms);
        std::vector<int> seen(size_t(items) * kv_tiles, 0);
        std::vector<int> partial_item(size_t(blocks), -1), partial_round(size_t(blocks), -1), merged(size_t(blocks), 0);
        bool ok = true;
        for (int b = 0; b < blocks; ++b)
          for (int round = 0;; ++round) {
            const WorkPiece w = t.piece(b, blocks, round);
            if (w.item < 0) break;
            const int end = std::min(w.kv_end, kv_tiles);
            ok = ok && w.item < items && w.kv_begin >= 0 && w.kv_begin < end;
            for (int j = w.kv_begin; j < end; ++j) ++seen[size_t(w.item) * kv_tiles + j];
            if (end < kv_tiles) {  // a partial: one per block
              ok = ok && partial_item[size_t(b)] < 0;
              partial_item[size_t(b)] = w.item;
              partial_round[size_t(b)] = round;
            } else if (w.kv_begin > 0) {  // ends a split item: the kernel's walk
              const int first = t.split_begin(b, blocks) - w.kv_begin;
              ok = ok && first == (w.item - t.whole_items) * kv_tiles;
              for (int u = first; u < first + w.kv_begin;) {
                const int owner = t.split_owner(u, blocks);
                ok = ok && owner < b && partial_item[size_t(owner)] == w.item;
                ok = ok && (partial_round[size_t(b)] < 0 || partial_round[size_t(b)] < round);
                ++merged[size_t(owner)];
                const int next = t.split_begin(owner + 1, blocks);
                ok = ok && next > u;
                if (next <= u) break;
                u = next;
              }
            }
          }
        for (int n : seen) ok = ok && n == 1;
        for (int b = 0; b < blocks; ++b) ok = ok && merged[size_t(b)] == (partial_item[size_t(b)] >= 0 ? 1 : 0);
        if (t.split_units > 0) {
          ++splits;
          // Worth it: every block's share of the last round saves it two key tiles.
          for (int b = 0; b < blocks; ++b) ok = ok && t.split_begin(b + 1, blocks) - t.split_begin(b, blocks) <= kv_tiles - 2;
        }
        if (!ok) std::printf("  items=%d kv_tiles=%d sms=%d\n", items, kv_tiles, sms);
        EXPECT_TRUE(ok);
      }
  EXPECT_TRUE(splits > 20);  // the cases above do split
}

TEST_CASE(tile_order_split_only_where_it_pays) {
  TileOrder t = order(344, 1, 0);  // D = 64, B = 1 H = 8 N = 8192: 2.6 rounds of 192-row tiles
  EXPECT_EQ(plan_kv_split(t, 64, 132, true), 132);
  EXPECT_EQ(t.whole_items, 264);  // two whole rounds, then 80 items over 132 blocks
  EXPECT_EQ(t.split_units, 80 * 64);
  t = order(344, 1, 0);
  EXPECT_EQ(plan_kv_split(t, 64, 132, false), 132);  // not allowed: whole items round by round
  EXPECT_EQ(t.split_units, 0);
  EXPECT_EQ(t.piece(0, 132, 2).item, 264);
  EXPECT_EQ(t.piece(100, 132, 2).item, -1);
  t = order(264, 1, 0);  // whole rounds: nothing to split
  EXPECT_EQ(plan_kv_split(t, 64, 132, true), 132);
  EXPECT_EQ(t.split_units, 0);
  t = order(263, 1, 0);  // 131 of 132 blocks busy in the last round: a share saves under two tiles
  plan_kv_split(t, 64, 132, true);
  EXPECT_EQ(t.split_units, 0);
  t = order(6, 1, 0);  // fewer items than SMs: all of them split (split-KV)
  EXPECT_EQ(plan_kv_split(t, 47, 132, true), 132);
  EXPECT_EQ(t.whole_items, 0);
  t = order(20, 1, 0);  // a key tile per item: nothing to split
  EXPECT_EQ(plan_kv_split(t, 1, 132, true), 20);
  EXPECT_EQ(t.split_units, 0);
}

// Rung 12's steps towards the engine (page 12) are registered, each run only
// when --variant names it: the default set ("*") has the engine and not them.
TEST_CASE(rung12_steps_run_on_request) {
  const char* steps[] = {"ws+tma", "ws+tma+pingpong", "ws+tma+pingpong+persistent"};
  for (const char* name : steps) {
    const Variant* v = find_variant<Variant>(name);
    EXPECT_TRUE(v != nullptr);
    if (v == nullptr) continue;
    EXPECT_TRUE(v->on_request && v->rung == "12_ws_pingpong");
    EXPECT_TRUE(!variant_selected("*", *v));
    EXPECT_TRUE(variant_selected("ws*", *v) && variant_selected(name, *v));
  }
  const Variant* engine = find_variant<Variant>("ws+stage2+pingpong");
  EXPECT_TRUE(engine != nullptr && !engine->on_request && variant_selected("*", *engine));
}
