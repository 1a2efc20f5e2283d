// Variable-length attention on the host, no GPU: the checks of cu_seqlens
// (varlen_lengths_invalid), the pair count of the FLOP convention, the work
// order the prepare kernel computes (varlen_tile_order, against a brute-force
// sort written here), and the harness's --varlen options.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "testing.h"
#include "hopper/bwd_scheduler.h"
#include "varlen/paged_decode.h"
#include "varlen/varlen.h"
#include "varlen/varlen_schedule.h"
#include "varlen_mode.h"

using namespace attnlab;

namespace {

std::vector<int> offsets(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

// A packed batch of these lengths, H = 2, D = 64, max_seqlen the longest of each.
VarlenProblem batch(const std::vector<int>& len_q, const std::vector<int>& len_k, bool causal) {
  VarlenProblem vp;
  vp.shape.B = int(len_q.size());
  vp.shape.H = 2;
  vp.shape.D = vp.shape.Dv = 64;
  vp.shape.causal = causal;
  vp.shape.Nq = len_q.empty() ? 0 : *std::max_element(len_q.begin(), len_q.end());
  vp.shape.Nk = len_k.empty() ? 0 : *std::max_element(len_k.begin(), len_k.end());
  vp.total_q = offsets(len_q).back();
  vp.total_k = offsets(len_k).back();
  return vp;
}

bool says(const std::string& why, const std::string& words) { return why.find(words) != std::string::npos; }

// Query i of a sequence sees key j: every key, or causal bottom-right within the sequence.
bool visible(int i, int j, int len_q, int len_k, bool causal) { return !causal || j <= i + (len_k - len_q); }

// The key tiles query tile m needs, by looking at every pair of the tile.
int key_tiles_brute_force(int m, int Br, int Bc, int len_q, int len_k, bool causal) {
  int tiles = 0;
  for (int j0 = 0; j0 < len_k; j0 += Bc) {
    bool any = false;
    for (int i = m * Br; i < std::min((m + 1) * Br, len_q) && !any; ++i)
      for (int j = j0; j < std::min(j0 + Bc, len_k) && !any; ++j) any = visible(i, j, len_q, len_k, causal);
    if (any) tiles = j0 / Bc + 1;  // the tiles a row needs are a prefix: the last one counts
  }
  return tiles;
}

// The order by hand: every (sequence, tile), stably sorted by capped key-tile count, descending.
std::vector<std::pair<int, int>> order_brute_force(const std::vector<int>& len_q, const std::vector<int>& len_k,
                                                   bool causal, int Br, int Bc) {
  struct Tile {
    int seq, m, work;
  };
  std::vector<Tile> tiles;
  for (size_t b = 0; b < len_q.size(); ++b)
    for (int m = 0; m * Br < len_q[b]; ++m)
      tiles.push_back({int(b), m,
                       std::min(key_tiles_brute_force(m, Br, Bc, len_q[b], len_k[b], causal), kVarlenTopBucket)});
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.work > b.work; });
  std::vector<std::pair<int, int>> order;
  for (const Tile& t : tiles) order.push_back({t.seq, t.m});
  return order;
}

std::vector<std::pair<int, int>> order_of(const std::vector<int>& len_q, const std::vector<int>& len_k, bool causal,
                                          int Br, int Bc) {
  const VarlenProblem vp = batch(len_q, len_k, causal);
  const std::vector<int> cu_q = offsets(len_q), cu_k = offsets(len_k);
  std::vector<std::pair<int, int>> order;
  for (const VarlenTile& t :
       varlen_tile_order(VarlenTiles::kQuery, vp.shape, cu_q.data(), cu_k.data(), vp.shape.B, vp.total_q,
                         vp.total_k, Br, Bc))
    order.push_back({t.seq, t.tile});
  return order;
}

ParseResult parse(std::vector<std::string> args) { return parse_args(args); }

}  // namespace

// ---- cu_seqlens ----------------------------------------------------------------------

TEST_CASE(varlen_offsets_that_describe_the_batch_pass) {
  const std::vector<int> len_q = {5, 0, 3}, len_k = {2, 7, 0};
  EXPECT_EQ(varlen_lengths_invalid(batch(len_q, len_k, false), offsets(len_q), offsets(len_k)), std::string());
  // max_seqlen may be more than the longest sequence.
  VarlenProblem loose = batch(len_q, len_k, true);
  loose.shape.Nq = 100;
  EXPECT_EQ(varlen_lengths_invalid(loose, offsets(len_q), offsets(len_k)), std::string());
}

TEST_CASE(varlen_offsets_each_broken_rule_is_named) {
  const std::vector<int> len = {5, 0, 3};
  const VarlenProblem vp = batch(len, len, false);
  const std::vector<int> good = offsets(len);  // 0, 5, 5, 8
  const std::string first = varlen_lengths_invalid(vp, {1, 5, 5, 8}, good);
  EXPECT_TRUE(says(first, "cu_seqlens_q[0] is 1, not 0"));
  const std::string decreasing = varlen_lengths_invalid(vp, good, {0, 5, 4, 8});
  EXPECT_TRUE(says(decreasing, "cu_seqlens_k decreases at sequence 1 (5 then 4)"));
  const std::string last = varlen_lengths_invalid(vp, {0, 5, 5, 7}, good);
  EXPECT_TRUE(says(last, "cu_seqlens_q[B] is 7, not the tensor's 8 rows"));
  VarlenProblem tight = vp;
  tight.shape.Nk = 4;  // sequence 0 has 5 keys
  const std::string longer = varlen_lengths_invalid(tight, good, good);
  EXPECT_TRUE(says(longer, "sequence 0 has 5 rows in cu_seqlens_k, more than its max_seqlen 4"));
  const std::string count = varlen_lengths_invalid(vp, {0, 5, 8}, good);
  EXPECT_TRUE(says(count, "cu_seqlens_q has 3 offsets; B = 3 sequences need 4"));
  VarlenProblem none = vp;
  none.shape.B = 0;
  EXPECT_TRUE(says(varlen_lengths_invalid(none, {0}, {0}), "at least one sequence"));
  for (const std::string& why : {first, decreasing, last, longer, count})
    EXPECT_TRUE(!why.empty() && why.find('\n') == std::string::npos);
}

// ---- the pair count ------------------------------------------------------------------

TEST_CASE(varlen_pairs_match_a_brute_force_count) {
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> batches = {
      {{8192, 1, 517, 3000}, {8192, 1, 517, 3000}},  // Nq = Nk per sequence
      {{0, 7, 0}, {3, 0, 0}},                          // empty sequences, keys without queries and back
      {{10, 3, 64}, {4, 9, 64}},                       // len_q > len_k (rows that see nothing, causal), and <
      {{1}, {1000}},                                   // decoding: one query over many keys
  };
  for (const auto& [len_q, len_k] : batches)
    for (bool causal : {false, true}) {
      int64_t expected = 0;
      for (size_t b = 0; b < len_q.size(); ++b)
        for (int i = 0; i < len_q[b]; ++i)
          for (int j = 0; j < len_k[b]; ++j) expected += visible(i, j, len_q[b], len_k[b], causal) ? 1 : 0;
      const VarlenProblem vp = batch(len_q, len_k, causal);
      EXPECT_EQ(varlen_unmasked_pairs_per_head(vp, offsets(len_q), offsets(len_k)), expected);
    }
  // Whole values, for a reader: 3 x 4 pairs and 2 x 0; causal 2 + 3 + 4 (query i sees keys 0 .. i + 1).
  EXPECT_EQ(varlen_unmasked_pairs_per_head(batch({3, 2}, {4, 0}, false), {0, 3, 5}, {0, 4, 4}), int64_t(12));
  EXPECT_EQ(varlen_unmasked_pairs_per_head(batch({3, 2}, {4, 0}, true), {0, 3, 5}, {0, 4, 4}), int64_t(2 + 3 + 4));
}

// ---- the work order ------------------------------------------------------------------

TEST_CASE(varlen_tile_order_is_a_stable_sort_by_key_tiles) {
  std::mt19937 rng(5);
  int cases = 0;
  for (const auto& [Br, Bc] : {std::pair{128, 176}, std::pair{192, 128}, std::pair{64, 64}, std::pair{128, 80}})
    for (bool causal : {false, true})
      for (int trial = 0; trial < 6; ++trial) {
        // Lengths of every kind: 0, a few rows, a tile and a bit, long; keys as many or not.
        const int B = 1 + int(rng() % 9);
        std::vector<int> len_q(static_cast<size_t>(B)), len_k(static_cast<size_t>(B));
        for (int b = 0; b < B; ++b) {
          const int kinds[] = {0, 1 + int(rng() % 7), Br + int(rng() % 5), int(rng() % 2000)};
          len_q[size_t(b)] = kinds[rng() % 4];
          len_k[size_t(b)] = trial % 2 ? kinds[rng() % 4] : len_q[size_t(b)];
        }
        const std::vector<std::pair<int, int>> order = order_of(len_q, len_k, causal, Br, Bc);
        EXPECT_TRUE(order == order_brute_force(len_q, len_k, causal, Br, Bc));
        // Every (sequence, tile) once, none of an empty sequence.
        std::set<std::pair<int, int>> seen(order.begin(), order.end());
        size_t tiles = 0;
        for (int len : len_q) tiles += size_t((len + Br - 1) / Br);
        EXPECT_EQ(seen.size(), order.size());
        EXPECT_EQ(order.size(), tiles);
        for (const auto& [seq, m] : order) EXPECT_TRUE(m * Br < len_q[size_t(seq)]);
        // Counts non-increasing along the order; ties in (sequence, tile) order.
        for (size_t i = 1; i < order.size(); ++i) {
          const auto [s0, m0] = order[i - 1];
          const auto [s1, m1] = order[i];
          const int w0 = key_tiles_brute_force(m0, Br, Bc, len_q[size_t(s0)], len_k[size_t(s0)], causal);
          const int w1 = key_tiles_brute_force(m1, Br, Bc, len_q[size_t(s1)], len_k[size_t(s1)], causal);
          EXPECT_TRUE(w0 >= w1);
          if (w0 == w1) EXPECT_TRUE(order[i - 1] < order[i]);
        }
        ++cases;
      }
  EXPECT_EQ(cases, 48);
}

TEST_CASE(varlen_tile_order_caps_the_counts_at_the_top_bucket) {
  // 1 x 1 tiles: query tile m of sequence b needs len_k key tiles (not causal).
  // Sequence 1 has more work than sequence 0, but both are past the cap: they
  // tie, in sequence order; sequence 2, under the cap, comes after them.
  const std::vector<int> len_q = {2, 2, 3, 0}, len_k = {kVarlenTopBucket + 1, kVarlenTopBucket + 40, 7, 5};
  const std::vector<std::pair<int, int>> order = order_of(len_q, len_k, false, 1, 1);
  const std::vector<std::pair<int, int>> expected = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {2, 2}};
  EXPECT_TRUE(order == expected);
  EXPECT_TRUE(order == order_brute_force(len_q, len_k, false, 1, 1));
  // Causal: the longer sequence's first tile needs fewer keys than its last.
  EXPECT_TRUE(order_of({3}, {3}, true, 1, 1) == (std::vector<std::pair<int, int>>{{0, 2}, {0, 1}, {0, 0}}));
}

// The backward's order costs a key tile by the query tiles that see it: the
// walk length bwd_work gives the dense backward (hopper/bwd_scheduler.h).
template <int Br, int Bc>
void expect_key_tile_costs_match_bwd_work(std::mt19937& rng) {
  for (int trial = 0; trial < 40; ++trial)
    for (bool causal : {false, true}) {
      const int len_q = int(rng() % 700), len_k = int(rng() % 700);
      const VarlenProblem vp = batch({len_q}, {len_k}, causal);
      const std::vector<int> cu_q = offsets({len_q}), cu_k = offsets({len_k});
      const VarlenSeq s = varlen_seq(cu_q.data(), cu_k.data(), 0, len_q, len_k);
      const AttnProblem p = varlen_seq_problem(vp.shape, s);
      EXPECT_EQ(varlen_tile_count(VarlenTiles::kKey, s, Br, Bc), (len_k + Bc - 1) / Bc);
      for (int j = 0; j * Bc < len_k; ++j) {
        const int walk = bwd_work<Br, Bc>(p, j, 0, 0, false).n_m;
        EXPECT_EQ(varlen_tile_bucket(VarlenTiles::kKey, vp.shape, s, j, Br, Bc), walk);
      }
    }
}

TEST_CASE(varlen_key_tile_order_costs_each_tile_by_its_backward_walk) {
  std::mt19937 rng(11);
  expect_key_tile_costs_match_bwd_work<64, 128>(rng);
  expect_key_tile_costs_match_bwd_work<128, 128>(rng);
  // Causal, 300 queries over 500 keys, Br = 64, Bc = 128: key tile 0 is seen by
  // every query tile (5), key tile 3 (keys 384..499) only by queries from 184
  // on, tiles 2..4 (3).
  const std::vector<int> cu_q = {0, 300}, cu_k = {0, 500};
  const std::vector<VarlenTile> order =
      varlen_tile_order(VarlenTiles::kKey, batch({300}, {500}, true).shape, cu_q.data(), cu_k.data(), 1, 300, 500, 64,
                        128);
  EXPECT_EQ(order.size(), size_t(4));
  EXPECT_TRUE(order[0].tile == 0 && order[3].tile == 3);
}

// ---- paged decoding's host side -------------------------------------------------------

namespace {
PagedDecodeProblem paged(int B, int Nq, int pages, int page_size, int max_pages, bool causal) {
  PagedDecodeProblem dp;
  dp.shape.B = B, dp.shape.H = 8, dp.shape.Hkv = 2, dp.shape.Nq = Nq, dp.shape.D = dp.shape.Dv = 128;
  dp.shape.causal = causal;
  dp.num_pages = pages, dp.page_size = page_size, dp.max_pages = max_pages;
  return dp;
}
}  // namespace

TEST_CASE(paged_decode_tables_each_broken_rule_is_named) {
  const PagedDecodeProblem dp = paged(2, 1, 4, 16, 2, true);
  // Sequence 0: 20 keys on pages 3, 1; sequence 1: 5 keys on page 0 (its second entry unread: -1).
  EXPECT_EQ(paged_decode_tables_invalid(dp, {3, 1, 0, -1}, {20, 5}), std::string());
  EXPECT_TRUE(says(paged_decode_tables_invalid(dp, {3, 1, 0}, {20, 5}), "block_table has 3 entries, not B x max_pages = 4"));
  EXPECT_TRUE(says(paged_decode_tables_invalid(dp, {3, 1, 0, -1}, {20}), "cache_seqlens has 1 entries, not B = 2"));
  EXPECT_TRUE(says(paged_decode_tables_invalid(dp, {3, 1, 0, -1}, {20, 33}),
                   "cache_seqlens[1] = 33 is outside [0, max_pages x page_size = 32]"));
  EXPECT_TRUE(says(paged_decode_tables_invalid(dp, {3, 4, 0, -1}, {20, 5}),
                   "block_table[0][1] = 4 is not a page of the cache (0 .. 3)"));
  EXPECT_TRUE(says(paged_decode_tables_invalid(dp, {3, 1, 0, -1}, {20, 17}), "block_table[1][1] = -1"));
}

TEST_CASE(paged_decode_pairs_and_splits) {
  // Causal, Nq = 4 new tokens over 10 keys: they see 7, 8, 9, 10 keys; over 2 keys: 0, 0, 1, 2.
  EXPECT_EQ(paged_decode_pairs_per_head(paged(2, 4, 4, 16, 2, true), {10, 2}), int64_t(7 + 8 + 9 + 10 + 1 + 2));
  EXPECT_EQ(paged_decode_pairs_per_head(paged(2, 4, 4, 16, 2, false), {10, 2}), int64_t(4 * 12));
  // Splits: two blocks per SM over B·Hkv row tiles, at least 4 key tiles of 64 each, at most 64.
  EXPECT_EQ(paged_decode_splits(paged(1, 1, 512, 256, 512, true), 132), 64);    // 1 x 2 blocks, 2048 tiles
  EXPECT_EQ(paged_decode_splits(paged(64, 1, 512, 256, 512, true), 132), 3);    // 128 blocks: ceil(264 / 128)
  EXPECT_EQ(paged_decode_splits(paged(1, 1, 4, 16, 16, true), 132), 1);         // 256 keys: 4 tiles
  EXPECT_EQ(paged_decode_splits(paged(512, 1, 512, 256, 512, true), 132), 1);  // more blocks than SMs
}

// ---- the harness's options -----------------------------------------------------------

TEST_CASE(cli_varlen_lengths_as_a_list) {
  const ParseResult r = parse({"--varlen", "8192,1,0,3000", "--H", "8", "--Hkv", "2", "--D", "128", "--causal",
                               "--dtype", "bf16", "--unverified"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.program == Program::kVarlen);
  const VarlenOptions& v = r.options.varlen;
  EXPECT_TRUE(v.q.lengths == std::vector<int>({8192, 1, 0, 3000}) && !v.q.random() && v.q.count() == 4);
  EXPECT_EQ(v.q.text, std::string("8192,1,0,3000"));
  EXPECT_TRUE(!v.k.given() && v.unverified && r.options.common.causal && r.options.common.Hkv == 2);
  std::vector<int> q, k;
  varlen_lengths(v, 1, &q, &k);
  EXPECT_TRUE(q == v.q.lengths && k == q);  // the keys: the queries' lengths
  // --varlen-k: the key lengths, one per sequence.
  const ParseResult with_k = parse({"--varlen", "5,0,9", "--varlen-k=1,4,0"});
  EXPECT_TRUE(with_k.ok());
  varlen_lengths(with_k.options.varlen, 1, &q, &k);
  EXPECT_TRUE(q == std::vector<int>({5, 0, 9}) && k == std::vector<int>({1, 4, 0}));
  EXPECT_TRUE(parse({"--varlen", "0"}).ok());  // one empty sequence
}

TEST_CASE(cli_varlen_random_lengths_come_from_the_seed) {
  const ParseResult r = parse({"--varlen", "random:16,100", "--seed", "7"});
  EXPECT_TRUE(r.ok());
  const VarlenOptions& v = r.options.varlen;
  EXPECT_TRUE(v.q.random() && v.q.random_count == 16 && v.q.random_mean == 100 && v.q.count() == 16);
  std::vector<int> q, k, again, k_again, other, unused;
  varlen_lengths(v, 7, &q, &k);
  varlen_lengths(v, 7, &again, &k_again);
  varlen_lengths(v, 8, &other, &unused);
  EXPECT_TRUE(q == again && k == q);  // deterministic for a seed
  EXPECT_TRUE(q != other);            // and another for another seed
  EXPECT_EQ(q.size(), size_t(16));
  for (int len : q) EXPECT_TRUE(len >= 1 && len <= 199);  // uniform in [1, 2·MEAN − 1]
  // Over many draws the mean is MEAN.
  VarlenOptions many;
  many.q.random_count = 20000;
  many.q.random_mean = 50;
  varlen_lengths(many, 3, &q, &k);
  double sum = 0;
  for (int len : q) sum += len;
  EXPECT_NEAR(sum / double(q.size()), 50.0, 1.0);
  // random: key lengths are drawn apart from the queries'.
  const ParseResult keys = parse({"--varlen", "random:16,100", "--varlen-k", "random:16,100"});
  EXPECT_TRUE(keys.ok());
  varlen_lengths(keys.options.varlen, 7, &q, &k);
  EXPECT_TRUE(q.size() == 16 && k.size() == 16 && q != k);
}

TEST_CASE(cli_varlen_malformed_lengths_are_one_line) {
  const char* form = "--varlen takes lengths separated by commas (8192,1,517,3000) or random:B,MEAN, got '";
  EXPECT_CONTAINS(parse({"--varlen", "8192,,1"}).error, form);
  EXPECT_CONTAINS(parse({"--varlen", "abc"}).error, form);
  EXPECT_CONTAINS(parse({"--varlen", ""}).error, form);
  EXPECT_CONTAINS(parse({"--varlen", "1,2,"}).error, form);
  EXPECT_CONTAINS(parse({"--varlen", "random:4"}).error, form);
  EXPECT_CONTAINS(parse({"--varlen", "random:4,5,6"}).error, form);
  EXPECT_EQ(parse({"--varlen", "3,-5"}).error,
            std::string("--varlen: sequence length -5 is negative (a length is 0 or more)"));
  EXPECT_CONTAINS(parse({"--varlen", "random:0,5"}).error,
                  "--varlen random:B,MEAN takes B from 1 to 65535 sequences, got 0");
  EXPECT_CONTAINS(parse({"--varlen", "random:4,0"}).error, "--varlen random:B,MEAN takes a mean length MEAN from 1 to");
  // The lengths must fit int32 offsets: the list's sum, every draw of random:.
  EXPECT_EQ(parse({"--varlen", "1073741824,1073741824"}).error,
            std::string("--varlen: the lengths sum to 2147483648 rows, more than the 2147483647 that int32 offsets "
                        "(cu_seqlens) address"));
  EXPECT_TRUE(parse({"--varlen", "1073741824,1073741823"}).ok());
  EXPECT_CONTAINS(parse({"--varlen", "random:65535,40000"}).error, "may sum to");
  EXPECT_CONTAINS(parse({"--varlen", "1", "--varlen-k", "1073741824,1073741824"}).error,
                  "--varlen-k: the lengths sum to");
  EXPECT_EQ(parse({"--varlen", "1,2", "--varlen-k", "3"}).error,
            std::string("--varlen-k gives 1 key length for 2 sequences (--varlen): one per sequence"));
  EXPECT_CONTAINS(parse({"--varlen", "random:3,9", "--varlen-k", "1,2"}).error, "--varlen-k gives 2 key lengths for 3");
  for (const char* bad : {"8192,,1", "-1", "random:0,1", "random:1,0", "1073741824,1073741824"})
    EXPECT_TRUE(parse({"--varlen", bad}).error.find('\n') == std::string::npos);
}

TEST_CASE(cli_varlen_refuses_the_fixed_shape_and_the_backward) {
  // --Nq is paged decoding's too (its new tokens); the others variable-length attention and it both refuse.
  for (const char* flag : {"--B", "--N", "--Nq", "--Nk"}) {
    const std::string e = parse({"--varlen", "4,5", flag, "4"}).error;
    const std::string programs = std::string(flag) == "--Nq" ? "every program but variable-length attention"
                                                             : "every program but variable-length attention and "
                                                               "paged decoding";
    EXPECT_EQ(e.rfind(std::string(flag) + " is an option of " + programs +
                          "; this run is variable-length attention (--varlen LENGTHS)",
                      0),
              size_t(0));
    EXPECT_CONTAINS(e, "the sequences and their lengths come from --varlen");
  }
  for (const char* flag : {"--bwd", "--deterministic"})
    EXPECT_CONTAINS(parse({"--varlen", "4,5", flag}).error,
                    "; the harness does not time the variable-length backward yet (build/test_varlen checks it)");
  EXPECT_CONTAINS(parse({"--varlen", "4", "--no-peers"}).error, "variable-length attention has no peers");
  // Its options belong to it alone, and it is one program among the others.
  EXPECT_EQ(parse({"--varlen-k", "4"}).error,
            std::string("--varlen-k is an option of variable-length attention (--varlen LENGTHS); this run is the "
                        "dense forward"));
  EXPECT_CONTAINS(parse({"--unverified"}).error, "--unverified is an option of variable-length attention");
  EXPECT_EQ(parse({"--varlen", "4", "--mask-mod", "causal"}).error,
            std::string("--varlen and --mask-mod select two programs (variable-length attention and block-sparse "
                        "attention): give one"));
  EXPECT_CONTAINS(parse({"--mask", "none", "--varlen", "4"}).error, "--mask and --varlen select two programs");
}

TEST_CASE(cli_varlen_runs_only_when_unverified_is_given) {
  // The options parse either way; whether the program starts is decided before any GPU is looked for.
  const ParseResult plain = parse({"--varlen", "8192,1,517,3000"});
  EXPECT_TRUE(plain.ok());
  EXPECT_EQ(varlen_options_unsupported(plain.options.varlen),
            std::string("the variable-length kernel has not run on a GPU yet; pass --unverified to run it anyway"));
  const ParseResult opted = parse({"--varlen", "8192,1,517,3000", "--unverified"});
  EXPECT_TRUE(opted.ok());
  EXPECT_EQ(varlen_options_unsupported(opted.options.varlen), std::string());
  // --list needs no GPU and no --unverified: ours (named as unverified) and the padded yardstick.
  const std::vector<ListEntry> list = varlen_list();
  EXPECT_TRUE(list.size() == 2 && list[0].name == "varlen (unverified)" && list[1].name == "dense padded (engine)");
  for (const ListEntry& e : list) EXPECT_TRUE(!e.about.empty() && e.about.find('\n') == std::string::npos);
}

TEST_CASE(varlen_lengths_summary_abbreviates_many) {
  EXPECT_EQ(varlen_lengths_summary({8192, 1, 517, 3000}), std::string("8192,1,517,3000"));
  EXPECT_EQ(varlen_lengths_summary({0}), std::string("0"));
  std::vector<int> many;
  for (int i = 1; i <= 20; ++i) many.push_back(i * 10);
  EXPECT_EQ(varlen_lengths_summary(many), std::string("10,20,30,40,... (20 sequences, 10 to 200, mean 105.0)"));
}
