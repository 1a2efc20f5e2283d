// The tensor maps' rules, checked on the host before any encoding
// (kernels/host/tensor_map.h, head_boxes_rule_broken): a map that keeps them
// passes, and each broken rule is named with the tensor and the number that
// breaks it, in one line.
#include <cstdint>
#include <string>

#include "host/tensor_map.h"
#include "testing.h"

using namespace attnlab;

namespace {
const void* at(uintptr_t address) { return reinterpret_cast<const void*>(address); }
bool says(const std::string& why, const std::string& words) { return why.find(words) != std::string::npos; }
}  // namespace

TEST_CASE(tensor_map_rules_pass_what_the_kernels_read) {
  // Q of B·H = 4 heads, N = 129 rows, D = 64 (fp16), boxes of 64 x 128; K at D = 256 in 64 x 64.
  EXPECT_TRUE(head_boxes_rule_broken("Q", at(0x7f0000000200), 2, 4, 129, 64, 64, 128).empty());
  EXPECT_TRUE(head_boxes_rule_broken("K", at(0x7f0000000010), 2, 1, 1, 256, 64, 64).empty());
  EXPECT_TRUE(head_boxes_rule_broken("dQ's accumulator", at(0x7f0000000100), 4, 8, 1031, 128, 32, 64).empty());
}

TEST_CASE(tensor_map_rules_name_each_broken_rule) {
  const std::string off = head_boxes_rule_broken("dO", at(0x7f0000000202), 2, 4, 129, 64, 64, 128);
  EXPECT_TRUE(says(off, "dO's base address") && says(off, "16-byte aligned"));
  const std::string stride = head_boxes_rule_broken("dO", at(0x7f0000000200), 2, 4, 129, 1028, 64, 128);
  EXPECT_TRUE(says(stride, "dO's row stride 2056 bytes is not a multiple of 16"));
  const std::string huge = head_boxes_rule_broken("K", at(0x7f0000000200), 2, 1, int64_t(1) << 30, 1024, 64, 64);
  EXPECT_TRUE(says(huge, "K's head stride") && says(huge, "2^40"));
  const std::string box = head_boxes_rule_broken("V", at(0x7f0000000200), 2, 1, 64, 64, 32, 64);
  EXPECT_TRUE(says(box, "V's box 32 x 64"));
  const std::string rows = head_boxes_rule_broken("Q", at(0x7f0000000200), 2, 1, 64, 64, 64, 512);
  EXPECT_TRUE(says(rows, "Q's box"));
  const std::string cols = head_boxes_rule_broken("Q", at(0x7f0000000200), 2, 1, 64, 96, 64, 64);
  EXPECT_TRUE(says(cols, "Q's 96 columns are not whole boxes of 64"));
  const std::string empty = head_boxes_rule_broken("Q", at(0x7f0000000200), 2, 0, 64, 64, 64, 64);
  EXPECT_TRUE(says(empty, "must each be in [1, 2^32]"));
  for (const std::string& why : {off, stride, huge, box, rows, cols, empty})
    EXPECT_TRUE(!why.empty() && why.find('\n') == std::string::npos);
}

TEST_CASE(tensor_map_rules_of_a_packed_variable_length_batch) {
  // Q packed [total = 1000, H = 8, D = 128] (fp16): row stride H·D, head stride D; boxes of 64 x 128.
  EXPECT_TRUE(strided_boxes_rule_broken("Q", at(0x7f0000000200), 2, 8, 1000, 128, 8 * 128, 128, 64, 128).empty());
  // A head stride of 24 elements (48 bytes) keeps the rule, one of 20 (40 bytes) breaks it.
  EXPECT_TRUE(strided_boxes_rule_broken("K", at(0x7f0000000200), 2, 3, 17, 64, 3 * 64, 24, 64, 64).empty());
  const std::string head = strided_boxes_rule_broken("K", at(0x7f0000000200), 2, 3, 17, 64, 3 * 64, 20, 64, 64);
  EXPECT_TRUE(says(head, "K's head stride 40 bytes is not a multiple of 16"));
  const std::string row = strided_boxes_rule_broken("V", at(0x7f0000000200), 2, 3, 17, 64, 3 * 64 + 4, 64, 64, 64);
  EXPECT_TRUE(says(row, "V's row stride 392 bytes is not a multiple of 16"));
  const std::string huge =
      strided_boxes_rule_broken("Q", at(0x7f0000000200), 2, 8, int64_t(1) << 31, 64, int64_t(1) << 39, 64, 64, 64);
  EXPECT_TRUE(says(huge, "Q's row stride") && says(huge, "2^40"));
  for (const std::string& why : {head, row, huge}) EXPECT_TRUE(!why.empty() && why.find('\n') == std::string::npos);
}
