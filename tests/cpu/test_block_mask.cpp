// The block mask (kernels/blocksparse/block_mask.h) against brute force: for
// every mask_mod, ragged lengths (1, 17, 113 x 203, 239 x 1, 799 x 3, 300 x
// 1000) and block sizes (128 x 128, 256 x 256, 64 x 128), each block's kind
// in the lists is what its in-bounds pairs say, every kept pair lies in a
// listed block, the transpose agrees, the dense-mask builder agrees with the
// mask_mod's, and a broken block mask is refused with a reason. Then the
// specs, the tensors the mods read (a tensor mask_mod's bit-packed words, a
// bias score_mod's elements, each with broadcast dimensions) and the check
// that they are attached.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../block_mask_cases.h"
#include "../tensor_mods_cases.h"
#include "blocksparse/block_mask.h"
#include "dmattn/dmattn.h"
#include "reference/mods_reference.h"
#include "testing.h"

using namespace attnlab;
using block_mask_cases::random_docs;
using tensor_mods_cases::PairShape;

namespace {

struct Shape {
  int Nq, Nk;
};
const Shape kShapes[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {300, 1000}, {256, 256}};
const int kBlocks[][2] = {{128, 128}, {256, 256}, {64, 128}};

// Every mask_mod, with arguments that make blocks of all three kinds.
std::vector<MaskMod> all_mods(int Nq, int Nk, const std::vector<int32_t>& doc, int doc_len) {
  std::vector<MaskMod> mods;
  std::string why;
  for (const char* spec : block_mask_cases::kMaskModSpecs) {
    MaskMod m = parse_mask_mod(spec, Nq, Nk, why);
    EXPECT_TRUE(why.empty());
    if (m.kind == MaskModKind::kDocument) {
      m.doc = doc.data();
      m.doc_len = doc_len;
    }
    mods.push_back(m);
  }
  return mods;
}

BlockKind brute_kind(const MaskMod& mod, const BlockMask& bm, int b, int h, int m, int n) {
  int64_t kept = 0, pairs = 0;
  for (int q = m * bm.block_q; q < std::min(bm.Nq, (m + 1) * bm.block_q); ++q)
    for (int k = n * bm.block_kv; k < std::min(bm.Nk, (n + 1) * bm.block_kv); ++k, ++pairs) kept += mod(b, h, q, k);
  return kept == 0 ? BlockKind::kEmpty : kept == pairs ? BlockKind::kFull : BlockKind::kPartial;
}

}  // namespace

TEST_CASE(fast_divmod_matches_division) {
  // Every divisor to 300 and the powers of two, over small n, n near multiples and n near 2^31.
  std::vector<int> divisors;
  for (int d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int e = 9; e <= 30; ++e) divisors.push_back(1 << e), divisors.push_back((1 << e) - 1), divisors.push_back((1 << e) + 1);
  long long wrong = 0;
  for (const int d : divisors) {
    const FastDivmod f(d);
    auto check = [&](int n) { wrong += f.div(n) != n / d || f.mod(n) != n % d; };
    for (int n = 0; n < 2000; ++n) check(n);
    for (int m = 1; m < 200; ++m)
      for (int r = -1; r <= 1; ++r)
        if (int64_t(m) * d + r >= 0 && int64_t(m) * d + r < (int64_t(1) << 31)) check(int(int64_t(m) * d + r));
    for (int n = INT32_MAX - 3000; n > 0 && n <= INT32_MAX - 1; ++n) check(n);
    check(INT32_MAX);
  }
  EXPECT_EQ(wrong, 0ll);
}

// keeps_pair, the kernels' branch-free form, against the short-circuit one
// for every mask_mod, over each shape and 130 indices past its ends (a
// ragged tile's rows and keys): the same answer, and the mask_mod only ever
// sees in-bounds indices (a document mask_mod's ids are exactly max(Nq, Nk)
// long here, so an index past them would read the next batch's ids).
TEST_CASE(keeps_pair_matches_bounds_and_mask_mod) {
  std::mt19937 rng(11);
  const int B = 2;
  for (const Shape& s : kShapes) {
    const int L = std::max(s.Nq, s.Nk);
    const std::vector<int32_t> doc = random_docs(B, L, rng);
    for (const MaskMod& mod : all_mods(s.Nq, s.Nk, doc, L)) {
      int64_t wrong = 0;
      for (int b = 0; b < B; ++b)
        for (int q = 0; q < s.Nq + 130; ++q)
          for (int k = 0; k < s.Nk + 130; ++k)
            wrong += keeps_pair(mod, b, 0, q, k, s.Nq, s.Nk) != (q < s.Nq && k < s.Nk && mod(b, 0, q, k));
      EXPECT_EQ(wrong, int64_t(0));
    }
  }
}

// block_partners, block_diagonal's range form in the kernels, against the
// short-circuit predicate from either side (rows fixed in the forward, keys in
// the backward), over each shape and 130 indices past its ends.
TEST_CASE(block_partners_match_bounds_and_mask_mod) {
  int64_t wrong = 0;
  for (const Shape& s : kShapes)
    for (const int a : {1, 3, 64, 100, 128, 1000}) {
      std::string why;
      const MaskMod mod = parse_mask_mod("block_diagonal:" + std::to_string(a), s.Nq, s.Nk, why);
      for (int q = 0; q < s.Nq + 130; ++q)
        for (int k = 0; k < s.Nk + 130; ++k) {
          const bool kept = q < s.Nq && k < s.Nk && mod(0, 0, q, k);
          wrong += block_partners(mod, q, s.Nq, s.Nk).keeps(k) != kept;
          wrong += block_partners(mod, k, s.Nk, s.Nq).keeps(q) != kept;
        }
    }
  EXPECT_EQ(wrong, int64_t(0));
}

// ResidueWalk, the kernels' periodic mask_mods' stepping residue, against %
// for every divisor up to 300 (below 8 as well: 8 mod d < d still), starts
// on and off a multiple of d, and enough steps to wrap many times.
TEST_CASE(residue_walk_matches_modulo) {
  int64_t wrong = 0;
  for (int d = 1; d <= 300; ++d)
    for (const int x0 : {0, 1, 7, d - 1, d, 3 * d + 5, 100003}) {
      ResidueWalk walk(FastDivmod(d), x0);
      for (int n = 0; n < 200; ++n, walk.next()) wrong += walk.r != (x0 + 8 * n) % d;
    }
  EXPECT_EQ(wrong, int64_t(0));
}

TEST_CASE(block_mask_kinds_match_brute_force) {
  std::mt19937 rng(7);
  const int B = 2, H = 2;
  for (const Shape& s : kShapes) {
    const int L = std::max(s.Nq, s.Nk);
    const std::vector<int32_t> doc = random_docs(B, L, rng);
    for (const MaskMod& mod : all_mods(s.Nq, s.Nk, doc, L))
      for (const auto& blk : kBlocks) {
        const BlockMask bm = block_mask_from_mod(mod, B, H, s.Nq, s.Nk, blk[0], blk[1]);
        EXPECT_EQ(bm.m_blocks, (s.Nq + blk[0] - 1) / blk[0]);
        EXPECT_EQ(bm.n_blocks, (s.Nk + blk[1] - 1) / blk[1]);
        int64_t kept_pairs = 0, wrong = 0, outside = 0;
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < H; ++h)
            for (int m = 0; m < bm.m_blocks; ++m)
              for (int n = 0; n < bm.n_blocks; ++n) {
                const BlockKind kind = listed_kind(bm, b, h, m, n);
                wrong += kind != brute_kind(mod, bm, b, h, m, n);
                for (int q = m * blk[0]; q < std::min(s.Nq, (m + 1) * blk[0]); ++q)
                  for (int k = n * blk[1]; k < std::min(s.Nk, (n + 1) * blk[1]); ++k)
                    if (mod(b, h, q, k)) {
                      ++kept_pairs;
                      outside += kind == BlockKind::kEmpty;
                    }
              }
        EXPECT_EQ(wrong, int64_t(0));
        EXPECT_EQ(outside, int64_t(0));  // no kept pair in an unlisted block
        EXPECT_TRUE(bm.visited_pairs() >= kept_pairs);
        EXPECT_EQ(block_mask_invalid(bm, B, H, s.Nq, s.Nk), std::string());
      }
  }
}

TEST_CASE(block_mask_transpose_lists_each_block_once) {
  std::string why;
  const MaskMod mod = parse_mask_mod("sliding_window:200,0", 300, 1000, why);
  const BlockMask bm = block_mask_from_mod(mod, 1, 3, 300, 1000, 64, 128);
  int64_t forward = 0, backward = 0;
  for (int n = 0; n < bm.n_blocks; ++n)
    for (int h = 0; h < 3; ++h) {
      const int64_t c = bm.col(0, h, n);
      backward += bm.q_count[c] + bm.full_q_count[c];
      for (int i = 0; i < bm.q_count[c]; ++i)
        EXPECT_TRUE(listed_kind(bm, 0, h, bm.q_index[c * bm.m_blocks + i], n) == BlockKind::kPartial);
      for (int i = 0; i < bm.full_q_count[c]; ++i)
        EXPECT_TRUE(listed_kind(bm, 0, h, bm.full_q_index[c * bm.m_blocks + i], n) == BlockKind::kFull);
    }
  for (size_t r = 0; r < bm.kv_count.size(); ++r) forward += bm.kv_count[r] + bm.full_count[r];
  EXPECT_EQ(forward, backward);
  EXPECT_TRUE(forward > 0);
}

TEST_CASE(block_mask_boundary_rule_full_ragged_block) {
  // 17 x 17 with one 128 x 128 block: every in-bounds pair kept -> full, not partial.
  std::string why;
  const BlockMask none = block_mask_from_mod(parse_mask_mod("none", 17, 17, why), 1, 1, 17, 17, 128, 128);
  EXPECT_EQ(none.full_count[0], 1);
  EXPECT_EQ(none.kv_count[0], 0);
  EXPECT_EQ(none.visited_pairs(), int64_t(17 * 17));
  // Causal 17 x 17: partial. Causal with Nq = 239, Nk = 1 (bottom-right):
  // k = 0 <= q + (1 - 239) holds for q = 238 alone.
  const BlockMask causal = block_mask_from_mod(parse_mask_mod("causal", 17, 17, why), 1, 1, 17, 17, 128, 128);
  EXPECT_EQ(causal.kv_count[0], 1);
  const MaskMod tall = parse_mask_mod("causal", 239, 1, why);
  EXPECT_TRUE(tall(0, 0, 238, 0) && !tall(0, 0, 237, 0));
  const BlockMask t = block_mask_from_mod(tall, 1, 1, 239, 1, 128, 128);
  EXPECT_EQ(t.kv_count[0] + t.full_count[0], 0);  // queries 0-127 see no key
  EXPECT_EQ(t.kv_count[1], 1);                    // queries 128-238: only 238 sees key 0
}

TEST_CASE(block_mask_dense_builder_matches_mod) {
  std::mt19937 rng(11);
  for (const Shape& s : kShapes) {
    const int B = 2, H = 3, L = std::max(s.Nq, s.Nk);
    const std::vector<int32_t> doc = random_docs(B, L, rng);
    for (const MaskMod& mod : all_mods(s.Nq, s.Nk, doc, L)) {
      std::vector<uint8_t> keep(size_t(B) * H * s.Nq * s.Nk);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int q = 0; q < s.Nq; ++q)
            for (int k = 0; k < s.Nk; ++k) keep[((size_t(b) * H + h) * s.Nq + q) * s.Nk + k] = mod(b, h, q, k);
      const BlockMask a = block_mask_from_mod(mod, B, H, s.Nq, s.Nk, 128, 128);
      const BlockMask d = block_mask_from_dense(keep, B, H, B, H, s.Nq, s.Nk, 128, 128);
      EXPECT_TRUE(a.kv_count == d.kv_count && a.kv_index == d.kv_index && a.full_count == d.full_count &&
                  a.full_index == d.full_index && a.q_index == d.q_index && a.full_q_index == d.full_q_index);
    }
  }
  // A [1, 1, Nq, Nk] mask broadcast over B = 2, H = 2.
  std::vector<uint8_t> keep(size_t(40) * 50);
  for (auto& x : keep) x = rng() % 3 == 0;
  const BlockMask d = block_mask_from_dense(keep, 1, 1, 2, 2, 40, 50, 16, 16);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int m = 0; m < d.m_blocks; ++m)
        EXPECT_EQ(d.kv_count[d.row(b, h, m)] + d.full_count[d.row(b, h, m)], d.kv_count[m] + d.full_count[m]);
}

TEST_CASE(block_mask_refuses_broken_masks) {
  std::string why;
  const BlockMask good = block_mask_from_mod(parse_mask_mod("causal", 300, 300, why), 1, 2, 300, 300, 128, 128);
  EXPECT_EQ(block_mask_invalid(good, 1, 2, 300, 300), std::string());
  EXPECT_CONTAINS(block_mask_invalid(good, 1, 2, 301, 300), "not this problem's");
  BlockMask bad = good;
  bad.kv_index[0] = 7;  // out of range (3 key blocks)
  EXPECT_CONTAINS(block_mask_invalid(bad, 1, 2, 300, 300), "out of range");
  bad = good;
  bad.full_count[bad.m_blocks - 1] = 0;  // the forward lists change, the backward ones do not
  EXPECT_CONTAINS(block_mask_invalid(bad, 1, 2, 300, 300), "transpose");
  bad = good;
  const int64_t r = bad.row(0, 0, 2);  // query block 2 of a causal 300 x 300: key blocks 0, 1 full, 2 partial
  EXPECT_EQ(bad.full_count[r], 2);
  bad.kv_index[r * bad.n_blocks + 0] = 1;  // key block 1 now also partial
  EXPECT_CONTAINS(block_mask_invalid(bad, 1, 2, 300, 300), "both partial and full");
  bad = good;
  bad.kv_index.pop_back();
  EXPECT_CONTAINS(block_mask_invalid(bad, 1, 2, 300, 300), "wrong size");
}

TEST_CASE(mask_and_score_mod_specs) {
  std::string why;
  EXPECT_TRUE(parse_mask_mod("sliding_window:128,0", 10, 20, why).kind == MaskModKind::kSlidingWindow);
  EXPECT_EQ(mask_mod_name(parse_mask_mod("sliding_window:128,0", 10, 20, why)), std::string("sliding_window:128,0"));
  EXPECT_EQ(parse_mask_mod("causal", 10, 20, why).off, 10);
  for (const char* bad : {"sliding_window:1", "block_diagonal:0", "mini_causal:x", "dilated_sliding_window:8,0",
                          "causal:3", "topk", "prefix_lm:-1", "prefix_lm:5,", "prefix_lm:+5", "sliding_window: 1,2",
                          "prefix_lm:1073741825", "prefix_lm:99999999999"}) {
    why.clear();
    EXPECT_TRUE(parse_mask_mod(bad, 10, 10, why).kind == MaskModKind::kNone);
    EXPECT_TRUE(!why.empty());
  }
  why.clear();
  const ScoreMod cap = parse_score_mod("softcap:30", 8, why);
  EXPECT_TRUE(why.empty() && cap.kind == ScoreModKind::kSoftcap);
  EXPECT_NEAR(cap(60.f, 0, 0, 0, 0), 30.f * std::tanh(2.f), 1e-5);
  EXPECT_NEAR(cap.grad(0.f), 1.f, 1e-6);
  EXPECT_EQ(score_mod_name(cap), std::string("softcap:30"));
  EXPECT_EQ(score_mod_name(parse_score_mod("softcap:0.5", 8, why)), std::string("softcap:0.5"));
  const ScoreMod alibi = parse_score_mod("alibi", 8, why);
  EXPECT_NEAR(alibi.alibi_slope(0), 0.5f, 1e-7);   // 2^(-8/8)
  EXPECT_NEAR(alibi.alibi_slope(7), 1.f / 256, 1e-9);
  EXPECT_NEAR(alibi(1.f, 0, 0, 3, 7), 1.f - 0.5f * 4, 1e-6);
  EXPECT_NEAR(parse_score_mod("rel_bias", 8, why)(1.f, 0, 0, 3, 7), 5.f, 1e-6);
  for (const char* bad : {"softcap", "softcap:0", "softcap:-1", "alibi:2", "tanh"}) {
    why.clear();
    parse_score_mod(bad, 8, why);
    EXPECT_TRUE(!why.empty());
  }
}

// The rows of mods_table.h: every mask_mod but the tensor one has a spec in
// the cases above (so that a new row is tested with the rest); each item of
// the lists parses to its row's kind, in the rows' order, and is named back
// as listed; the tensor mods are the ones the harness's lists leave out.
TEST_CASE(every_mod_of_the_table_is_listed_and_tested) {
  std::string why;
  for (int k = 0; k < kMaskModCount; ++k) {
    int specs = 0;
    for (const char* spec : block_mask_cases::kMaskModSpecs)
      specs += parse_mask_mod(spec, 10, 20, why).kind == MaskModKind(k) ? 1 : 0;
    EXPECT_TRUE(specs > 0 || is_tensor_mod(MaskModKind(k)));
  }
  auto items = [](const std::string& list) {  // "a, b:X,Y, c" -> {"a", "b:X,Y", "c"}
    std::vector<std::string> out;
    for (size_t at = 0, end = 0; at <= list.size(); at = end + 2) {
      end = std::min(list.find(", ", at), list.size());
      out.push_back(list.substr(at, end - at));
    }
    return out;
  };
  auto listed = [&](const std::vector<std::string>& list, const std::string& item) {
    return std::find(list.begin(), list.end(), item) != list.end();
  };
  const std::vector<std::string> masks = items(mask_mod_names(true)), harness_masks = items(mask_mod_names(false));
  EXPECT_EQ(int(masks.size()), kMaskModCount);
  for (size_t k = 0; k < masks.size(); ++k) {
    const std::string name = masks[k].substr(0, masks[k].find(':')), args = masks[k].substr(name.size());
    const std::string spec = args.empty() ? name : name + (args.find(',') != std::string::npos ? ":3,4" : ":3");
    why.clear();
    const MaskMod m = parse_mask_mod(spec, 10, 20, why);
    EXPECT_EQ(why, std::string());
    EXPECT_EQ(int(m.kind), int(k));
    EXPECT_EQ(mask_mod_name(m), spec);
    EXPECT_EQ(is_tensor_mod(m.kind), !listed(harness_masks, masks[k]));
  }
  const std::vector<std::string> scores = items(score_mod_names(true)), harness_scores = items(score_mod_names(false));
  EXPECT_EQ(int(scores.size()), kScoreModCount);
  for (size_t k = 0; k < scores.size(); ++k) {
    const std::string name = scores[k].substr(0, scores[k].find(':'));
    const std::string spec = scores[k] == name ? name : name + ":2";
    why.clear();
    const ScoreMod s = parse_score_mod(spec, 8, why);
    EXPECT_EQ(why, std::string());
    EXPECT_EQ(int(s.kind), int(k));
    EXPECT_EQ(score_mod_name(s), spec);
    EXPECT_EQ(is_tensor_mod(s.kind), !listed(harness_scores, scores[k]));
  }
}

// The specs of the mods that read tensors: their names round-trip, they take
// no arguments, and each names what it lacks until its tensor is attached.
TEST_CASE(tensor_mod_specs_and_missing_tensors) {
  std::string why;
  const MaskMod tensor = parse_mask_mod("tensor", 10, 20, why);
  EXPECT_TRUE(why.empty() && tensor.kind == MaskModKind::kTensor);
  EXPECT_EQ(mask_mod_name(tensor), std::string("tensor"));
  EXPECT_TRUE(parse_mask_mod(mask_mod_name(tensor), 10, 20, why).kind == MaskModKind::kTensor && why.empty());
  const ScoreMod bias = parse_score_mod("bias", 8, why);
  EXPECT_TRUE(why.empty() && bias.kind == ScoreModKind::kBias);
  EXPECT_EQ(score_mod_name(bias), std::string("bias"));
  EXPECT_TRUE(parse_score_mod(score_mod_name(bias), 8, why).kind == ScoreModKind::kBias && why.empty());
  EXPECT_NEAR(bias.grad(3.f), 1.f, 0);  // s' = s + bias: ds'/ds = 1
  EXPECT_NEAR(bias.grad_from_output(3.f), 1.f, 0);
  for (const char* bad : {"tensor:1", "tensors"}) {
    why.clear();
    EXPECT_TRUE(parse_mask_mod(bad, 10, 10, why).kind == MaskModKind::kNone);
    EXPECT_TRUE(!why.empty());
  }
  for (const char* bad : {"bias:1", "biases"}) {
    why.clear();
    EXPECT_TRUE(parse_score_mod(bad, 8, why).kind == ScoreModKind::kNone);
    EXPECT_TRUE(!why.empty());
  }

  // mods_missing_tensors: "" without tensor mods, or once each one's tensor is there.
  const int32_t ids[4] = {};
  const uint32_t words[2] = {};
  const uint16_t elems[1] = {};
  const MaskMod none_mask;
  const ScoreMod none_score, rel = parse_score_mod("rel_bias", 8, why);
  EXPECT_EQ(mods_missing_tensors(none_mask, none_score), std::string());
  EXPECT_EQ(mods_missing_tensors(parse_mask_mod("causal", 10, 10, why), rel), std::string());
  MaskMod doc = parse_mask_mod("document", 4, 4, why);
  EXPECT_CONTAINS(mods_missing_tensors(doc, none_score), "document mask_mod");
  doc.doc = ids;  // ids without their length
  EXPECT_CONTAINS(mods_missing_tensors(doc, none_score), "document mask_mod");
  doc.doc_len = 4;
  EXPECT_EQ(mods_missing_tensors(doc, none_score), std::string());
  doc.doc = nullptr;  // a length without ids
  EXPECT_CONTAINS(mods_missing_tensors(doc, none_score), "document mask_mod");
  MaskMod bits = tensor;
  EXPECT_CONTAINS(mods_missing_tensors(bits, none_score), "tensor mask_mod");
  bits.bits.data = words;
  EXPECT_EQ(mods_missing_tensors(bits, none_score), std::string());
  ScoreMod with_bias = bias;
  EXPECT_CONTAINS(mods_missing_tensors(none_mask, with_bias), "bias score_mod");
  EXPECT_CONTAINS(mods_missing_tensors(bits, with_bias), "bias score_mod");  // the words are not the bias
  EXPECT_TRUE(!mods_missing_tensors(tensor, with_bias).empty());  // both missing
  EXPECT_CONTAINS(mods_missing_tensors(tensor, rel), "tensor mask_mod");
  with_bias.bias.data = elems;
  EXPECT_EQ(mods_missing_tensors(none_mask, with_bias), std::string());
  EXPECT_EQ(mods_missing_tensors(bits, with_bias), std::string());
  EXPECT_CONTAINS(mods_missing_tensors(tensor, with_bias), "tensor mask_mod");
}

// The tensor mask_mod on host words: a random keep matrix in each broadcast
// shape, packed as dmattn's bit rows (bit k % 32 of word k / 32, rows of
// dma_mask_bit_row_words(Nk) words, the padding bits set to 1, which no key
// reads), read back through the functor for every pair; keeps_pair with
// indices past the ends; and the block mask built from it against the dense
// builder's from the same keep bytes.
TEST_CASE(tensor_mask_mod_reads_packed_bits) {
  std::mt19937 rng(23);
  const int B = 2, H = 3;
  const Shape shapes[] = {{1, 1}, {17, 31}, {5, 32}, {9, 33}, {4, 64}, {3, 65}, {113, 203}};
  const PairShape forms[] = {{B, H, 0}, {1, H, 0}, {B, 1, 0}, {B, H, 1}, {1, 1, 1}, {1, H, 1}};
  for (const Shape& s : shapes)
    for (PairShape f : forms) {
      if (f.q == 0) f.q = s.Nq;
      const int64_t row_words = dma_mask_bit_row_words(s.Nk);
      EXPECT_EQ(row_words, int64_t(2 * ((s.Nk + 63) / 64)));
      std::vector<uint8_t> keep(size_t(f.rows() * s.Nk));
      const int density = int(rng() % 3) + 2;  // keep 1 in 2 to 1 in 4 pairs
      for (auto& x : keep) x = rng() % density == 0;
      std::vector<uint32_t> words(size_t(f.rows() * row_words), 0u);
      for (int64_t r = 0; r < f.rows(); ++r) {
        for (int k = 0; k < s.Nk; ++k)
          if (keep[size_t(r * s.Nk + k)]) words[size_t(r * row_words + k / 32)] |= 1u << (k % 32);
        for (int64_t k = s.Nk; k < 32 * row_words; ++k) words[size_t(r * row_words + k / 32)] |= 1u << (k % 32);
      }
      std::string why;
      MaskMod mod = parse_mask_mod("tensor", s.Nq, s.Nk, why);
      mod.bits = f.strides(row_words);
      mod.bits.data = words.data();
      EXPECT_EQ(mods_missing_tensors(mod, ScoreMod{}), std::string());
      int64_t wrong = 0, wrong_bounds = 0, kept = 0;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int q = 0; q < s.Nq + 9; ++q)
            for (int k = 0; k < s.Nk + 70; ++k) {
              const bool in = q < s.Nq && k < s.Nk;
              const bool want = in && keep[size_t(f.at(b, h, q) * s.Nk + k)] != 0;
              if (in) {
                wrong += mod(b, h, q, k) != want;
                kept += want;
              }
              wrong_bounds += keeps_pair(mod, b, h, q, k, s.Nq, s.Nk) != want;
            }
      EXPECT_EQ(wrong, int64_t(0));
      EXPECT_EQ(wrong_bounds, int64_t(0));
      EXPECT_TRUE(s.Nq * s.Nk < 64 || kept > 0);  // the check saw kept pairs
      // The block mask of the words equals the dense builder's of the bytes
      // (expanded over a broadcast query dimension; B, H broadcast as they are).
      std::vector<uint8_t> dense(size_t(f.b) * f.h * s.Nq * s.Nk);
      for (int b = 0; b < f.b; ++b)
        for (int h = 0; h < f.h; ++h)
          for (int q = 0; q < s.Nq; ++q)
            for (int k = 0; k < s.Nk; ++k)
              dense[((size_t(b) * f.h + h) * s.Nq + q) * s.Nk + k] = keep[size_t(f.at(b, h, q) * s.Nk + k)];
      const BlockMask a = block_mask_from_mod(mod, B, H, s.Nq, s.Nk, 64, 128);
      const BlockMask d = block_mask_from_dense(dense, f.b, f.h, B, H, s.Nq, s.Nk, 64, 128);
      EXPECT_TRUE(a.kv_count == d.kv_count && a.kv_index == d.kv_index && a.full_count == d.full_count &&
                  a.full_index == d.full_index && a.q_index == d.q_index && a.full_q_index == d.full_q_index);
    }
}

// ScoreMod::bias_at on host arrays in both dtypes, full and broadcast, with
// the clamp of q >= nq, k >= nk into the last row and column; the functor and
// the double reference (score_mod_double) add exactly that element.
TEST_CASE(bias_score_mod_reads_elements) {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.f, 2.f);
  const int B = 2, H = 3, Nq = 5, Nk = 7;
  const PairShape forms[] = {{B, H, Nq}, {1, H, 1}, {B, 1, Nq}, {1, 1, 1}};
  for (const bool bf16 : {false, true})
    for (const PairShape& f : forms) {
      std::vector<float> value(size_t(f.rows() * Nk));  // each element as stored (rounded to the dtype)
      std::vector<__half> h16(value.size());
      std::vector<__nv_bfloat16> b16(value.size());
      for (size_t e = 0; e < value.size(); ++e) {
        const float x = normal(rng);
        h16[e] = __float2half_rn(x);
        b16[e] = __float2bfloat16_rn(x);
        value[e] = bf16 ? __bfloat162float(b16[e]) : __half2float(h16[e]);
      }
      std::string why;
      ScoreMod mod = parse_score_mod("bias", H, why);
      mod.bias = f.strides(Nk);
      mod.bias.data = bf16 ? static_cast<const void*>(b16.data()) : static_cast<const void*>(h16.data());
      mod.bias_bf16 = bf16;
      mod.nq = Nq, mod.nk = Nk;
      int64_t wrong = 0;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int q = 0; q < Nq + 4; ++q)
            for (int k = 0; k < Nk + 4; ++k) {
              const float want = value[size_t(f.at(b, h, std::min(q, Nq - 1)) * Nk + std::min(k, Nk - 1))];
              wrong += mod.bias_at(b, h, q, k) != want;
              wrong += mod(0.25f, b, h, q, k) != 0.25f + want;
              wrong += score_mod_double(mod, 0.25, b, h, q, k) != 0.25 + double(want);
            }
      EXPECT_EQ(wrong, int64_t(0));
    }
  // The dtype flag picks the reading: 1.5 is 0x3E00 in fp16, 0x3FC0 in bf16.
  const uint16_t one_and_half[2] = {0x3E00, 0x3FC0};
  ScoreMod m;
  m.kind = ScoreModKind::kBias;
  m.bias.data = &one_and_half[0];
  EXPECT_NEAR(m.bias_at(0, 0, 0, 0), 1.5, 0);
  m.bias.data = &one_and_half[1], m.bias_bf16 = true;
  EXPECT_NEAR(m.bias_at(0, 0, 0, 0), 1.5, 0);
  EXPECT_NEAR(m.bias_at(0, 0, 3, 9), 1.5, 0);  // nq = nk = 1: every pair reads the one element
}
