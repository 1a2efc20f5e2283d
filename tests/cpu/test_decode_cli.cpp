// Paged decoding on the host, no GPU: the harness's --decode options (the
// lengths, --Nq, --page-size, the mask, the flags it refuses, the
// --unverified gate, --list) and the paged cache it builds (its shape and its
// block table, against the kernel's own check of a table).
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cli.h"
#include "decode_mode.h"
#include "testing.h"
#include "varlen/paged_decode.h"

using namespace attnlab;

namespace {

ParseResult parse(std::vector<std::string> args) { return parse_args(args); }

// The problem decode_mode builds for these lengths, H = 8 over 2 KV heads, D = 64.
PagedDecodeProblem problem(const std::vector<int>& lengths, int page_size) {
  const DecodeCacheShape shape = decode_cache_shape(lengths, page_size);
  PagedDecodeProblem dp;
  dp.shape.B = int(lengths.size());
  dp.shape.H = 8, dp.shape.Hkv = 2, dp.shape.Nq = 1, dp.shape.D = dp.shape.Dv = 64;
  dp.page_size = page_size;
  dp.max_pages = shape.max_pages;
  dp.num_pages = int(shape.num_pages);
  return dp;
}

}  // namespace

// ---- the options ------------------------------------------------------------------------

TEST_CASE(cli_decode_lengths_and_defaults) {
  const ParseResult r = parse({"--decode", "4096,1,0,517", "--H", "32", "--Hkv", "8", "--D", "128", "--dtype", "bf16",
                               "--unverified"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.program == Program::kDecode);
  const DecodeOptions& d = r.options.decode;
  EXPECT_TRUE(d.lengths.lengths == std::vector<int>({4096, 1, 0, 517}) && !d.lengths.random());
  EXPECT_EQ(d.lengths.text, std::string("4096,1,0,517"));
  EXPECT_TRUE(d.unverified && !r.options.varlen.unverified);
  // Decoding's defaults: one new token, causal, pages of 64 rows.
  const CommonOptions& c = r.options.common;
  EXPECT_TRUE(c.Nq == 1 && c.causal && d.page_size == 64);
  EXPECT_TRUE(c.H == 32 && c.Hkv == 8 && c.D == 128 && c.Dv == 128 && c.dtype == DType::kBFloat16);
  EXPECT_TRUE(decode_lengths(d, 1) == d.lengths.lengths);
  EXPECT_TRUE(parse({"--decode", "0"}).ok());  // one empty cache
  // Outside paged decoding the defaults are the dense ones, and --unverified is variable-length attention's.
  EXPECT_TRUE(!parse({}).options.common.causal && parse({}).options.common.Nq == 4096);
  const Options varlen = parse({"--varlen", "4", "--unverified"}).options;
  EXPECT_TRUE(varlen.varlen.unverified && !varlen.decode.unverified);
}

TEST_CASE(cli_decode_new_tokens_page_size_and_mask) {
  const ParseResult r = parse({"--decode", "300,5", "--Nq", "16", "--page-size", "7", "--no-causal"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.common.Nq == 16 && r.options.decode.page_size == 7 && !r.options.common.causal);
  EXPECT_TRUE(parse({"--decode", "3", "--Nq", "1024"}).ok());
  EXPECT_TRUE(parse({"--decode", "3", "--causal"}).options.common.causal);  // the default, said again
  EXPECT_TRUE(parse({"--decode", "3", "--page-size", "1"}).ok());
  // --Nq: 1 to 1024 new tokens here; the dense programs' query lengths elsewhere.
  EXPECT_EQ(parse({"--decode", "3", "--Nq", "1025"}).error, std::string("--Nq must be between 1 and 1024, got 1025"));
  EXPECT_EQ(parse({"--decode", "3", "--Nq", "0"}).error, std::string("--Nq must be between 1 and 1024, got 0"));
  EXPECT_EQ(parse({"--decode", "3", "--Nq", "x"}).error, std::string("--Nq expects an integer, got 'x'"));
  EXPECT_TRUE(parse({"--Nq", "2000"}).ok());
  EXPECT_EQ(parse({"--decode", "3", "--page-size", "0"}).error,
            std::string("--page-size must be between 1 and 1073741824, got 0"));
  EXPECT_EQ(parse({"--decode", "3", "--page-size", "-4"}).error,
            std::string("--page-size must be between 1 and 1073741824, got -4"));
  EXPECT_EQ(parse({"--decode", "3", "--page-size", "16k"}).error,
            std::string("--page-size expects an integer, got '16k'"));
  EXPECT_EQ(parse({"--decode", "3", "--causal", "--no-causal"}).error,
            std::string("--causal and --no-causal contradict each other"));
  EXPECT_EQ(parse({"--decode", "3", "--D", "128", "--Dv", "64"}).error,
            std::string("paged decoding needs Dv == D, got --D 128 and --Dv 64"));
}

TEST_CASE(cli_decode_random_lengths_come_from_the_seed) {
  const ParseResult r = parse({"--decode", "random:16,100", "--seed", "7"});
  EXPECT_TRUE(r.ok());
  const DecodeOptions& d = r.options.decode;
  EXPECT_TRUE(d.lengths.random() && d.lengths.random_count == 16 && d.lengths.random_mean == 100);
  const std::vector<int> lengths = decode_lengths(d, 7);
  EXPECT_TRUE(lengths == decode_lengths(d, 7));  // deterministic for a seed
  EXPECT_TRUE(lengths != decode_lengths(d, 8));  // and another for another seed
  EXPECT_EQ(lengths.size(), size_t(16));
  for (int len : lengths) EXPECT_TRUE(len >= 1 && len <= 199);  // uniform in [1, 2·MEAN − 1]
}

TEST_CASE(cli_decode_malformed_lengths_are_one_line) {
  const char* form = "--decode takes lengths separated by commas (8192,1,517,3000) or random:B,MEAN, got '";
  for (const char* bad : {"1,,2", "abc", "", "1,2,", "random:4", "random:4,5,6"})
    EXPECT_CONTAINS(parse({"--decode", bad}).error, form);
  EXPECT_EQ(parse({"--decode", "3,-5"}).error,
            std::string("--decode: sequence length -5 is negative (a length is 0 or more)"));
  EXPECT_CONTAINS(parse({"--decode", "random:0,5"}).error,
                  "--decode random:B,MEAN takes B from 1 to 65535 sequences, got 0");
  EXPECT_CONTAINS(parse({"--decode", "random:4,0"}).error, "--decode random:B,MEAN takes a mean length MEAN from 1 to");
  EXPECT_CONTAINS(parse({"--decode", "1073741825"}).error,
                  "--decode: sequence length 1073741825 is more than 1073741824");
  // A cache has no offsets: no bound on the lengths' sum (the mode counts its pages when it starts).
  EXPECT_TRUE(parse({"--decode", "1073741824,1073741824"}).ok());
  EXPECT_TRUE(parse({"--decode", "random:65535,40000"}).ok());
  for (const char* bad : {"1,,2", "-1", "random:0,1", "random:1,0"})
    EXPECT_TRUE(parse({"--decode", bad}).error.find('\n') == std::string::npos);
}

TEST_CASE(cli_decode_refuses_the_fixed_shape_the_backward_and_the_peers) {
  for (const char* flag : {"--B", "--N", "--Nk"})
    EXPECT_EQ(parse({"--decode", "4,5", flag, "4"}).error,
              std::string(flag) + " is an option of every program but variable-length attention and paged decoding; "
                                  "this run is paged decoding (--decode LENGTHS); the sequences and their cache "
                                  "lengths come from --decode (--Nq: the new tokens of each)");
  for (const char* flag : {"--bwd", "--deterministic"})
    EXPECT_CONTAINS(parse({"--decode", "4,5", flag}).error,
                    "; this run is paged decoding (--decode LENGTHS); paged decoding has a forward only (decoding is "
                    "inference)");
  for (const char* flag : {"--torch", "--sdpa", "--no-peers"})
    EXPECT_CONTAINS(parse({"--decode", "4", flag}).error,
                    "; paged decoding has no peers (its copy row is a bandwidth yardstick)");
  for (const char* flag : {"--variant", "--window", "--score-mod", "--varlen-k"}) {
    const std::string e = parse({"--decode", "4", flag, "x"}).error;
    EXPECT_EQ(e.rfind(std::string(flag) + " is an option of ", 0), size_t(0));
    EXPECT_CONTAINS(e, "; this run is paged decoding (--decode LENGTHS)");
  }
  // Its options belong to it alone (--unverified to variable-length attention too), and it is one program
  // among the others.
  EXPECT_EQ(parse({"--page-size", "16"}).error,
            std::string("--page-size is an option of paged decoding (--decode LENGTHS); this run is the dense "
                        "forward"));
  EXPECT_EQ(parse({"--no-causal"}).error,
            std::string("--no-causal is an option of paged decoding (--decode LENGTHS); this run is the dense "
                        "forward"));
  EXPECT_EQ(parse({"--unverified"}).error,
            std::string("--unverified is an option of variable-length attention and paged decoding; this run is the "
                        "dense forward"));
  EXPECT_CONTAINS(parse({"--varlen", "4", "--page-size", "16"}).error,
                  "--page-size is an option of paged decoding (--decode LENGTHS); this run is variable-length");
  EXPECT_EQ(parse({"--varlen", "4", "--decode", "4"}).error,
            std::string("--varlen and --decode select two programs (variable-length attention and paged decoding): "
                        "give one"));
  EXPECT_CONTAINS(parse({"--decode", "4", "--mask-mod", "causal"}).error,
                  "--decode and --mask-mod select two programs");
  EXPECT_CONTAINS(parse({"--mask", "none", "--decode", "4"}).error, "--mask and --decode select two programs");
}

TEST_CASE(cli_decode_runs_only_when_unverified_is_given) {
  // The options parse either way; whether the program starts is decided before any GPU is looked for.
  const ParseResult plain = parse({"--decode", "4096,517"});
  EXPECT_TRUE(plain.ok());
  EXPECT_EQ(decode_options_unsupported(plain.options.decode),
            std::string("the paged-decoding kernel has not run on a GPU yet; pass --unverified to run it anyway"));
  const ParseResult opted = parse({"--decode", "4096,517", "--unverified"});
  EXPECT_TRUE(opted.ok());
  EXPECT_EQ(decode_options_unsupported(opted.options.decode), std::string());
  // --list needs no GPU and no --unverified: ours (named as unverified) and the copy yardstick.
  const std::vector<ListEntry> list = decode_list();
  EXPECT_TRUE(list.size() == 2 && list[0].name == "decode (unverified)" && list[1].name == "copy (bandwidth)");
  for (const ListEntry& e : list) EXPECT_TRUE(!e.about.empty() && e.about.find('\n') == std::string::npos);
}

TEST_CASE(cli_decode_in_the_help) {
  const std::string u = usage();
  EXPECT_CONTAINS(u, "\npaged decoding (--decode LENGTHS):\n  Decoding against a paged KV cache");
  EXPECT_CONTAINS(u, "\noptions of paged decoding (--decode LENGTHS):\n  --decode LENGTHS");
  EXPECT_CONTAINS(u, "\noptions of variable-length attention and paged decoding:\n  --unverified");
  EXPECT_CONTAINS(u, "--decode paged decoding");
}

// ---- the cache ------------------------------------------------------------------------

TEST_CASE(decode_cache_shape_counts_pages) {
  // 20 keys in pages of 16: 2 pages; 5: 1; 0: none; the table 2 wide; 3 pages besides.
  DecodeCacheShape s = decode_cache_shape({20, 5, 0}, 16);
  EXPECT_TRUE(s.max_pages == 2 && s.num_pages == 3 + kDecodeSparePages);
  s = decode_cache_shape({0, 0}, 64);  // no keys: one column (of -1), the spare pages alone
  EXPECT_TRUE(s.max_pages == 1 && s.num_pages == kDecodeSparePages);
  s = decode_cache_shape({1000, 64, 65}, 1);
  EXPECT_TRUE(s.max_pages == 1000 && s.num_pages == 1129 + kDecodeSparePages);
  s = decode_cache_shape({1073741824, 1073741824, 1073741824}, 1);  // past int32: the mode refuses it
  EXPECT_TRUE(s.num_pages == 3 * int64_t(1073741824) + kDecodeSparePages);
}

TEST_CASE(decode_block_table_is_a_permutation_the_kernel_accepts) {
  for (const int page_size : {1, 7, 16, 64, 256})
    for (const std::vector<int>& lengths :
         {std::vector<int>{1000, 0, 1, 17, 300}, std::vector<int>{0}, std::vector<int>{64, 64, 65}}) {
      const PagedDecodeProblem dp = problem(lengths, page_size);
      const std::vector<int> table = decode_block_table(lengths, page_size, dp.max_pages, dp.num_pages, 5);
      EXPECT_EQ(paged_decode_tables_invalid(dp, table, lengths), std::string());
      EXPECT_EQ(table.size(), lengths.size() * size_t(dp.max_pages));
      // Each sequence's pages in its first entries, -1 after them; no page read twice, every one in the cache.
      std::set<int> seen;
      for (size_t b = 0; b < lengths.size(); ++b)
        for (int j = 0; j < dp.max_pages; ++j) {
          const int page = table[b * size_t(dp.max_pages) + size_t(j)];
          if (int64_t(j) * page_size < lengths[b]) {
            EXPECT_TRUE(page >= 0 && page < dp.num_pages && seen.insert(page).second);
          } else {
            EXPECT_EQ(page, -1);
          }
        }
      EXPECT_EQ(int64_t(seen.size()) + kDecodeSparePages, int64_t(dp.num_pages));
    }
  // From the seed: the same table for a seed, another for another; not the pages in order.
  const std::vector<int> lengths = {1000, 300};
  const PagedDecodeProblem dp = problem(lengths, 16);
  const std::vector<int> table = decode_block_table(lengths, 16, dp.max_pages, dp.num_pages, 5);
  EXPECT_TRUE(table == decode_block_table(lengths, 16, dp.max_pages, dp.num_pages, 5));
  EXPECT_TRUE(table != decode_block_table(lengths, 16, dp.max_pages, dp.num_pages, 6));
  std::vector<int> first(table.begin(), table.begin() + 63);  // sequence 0: 63 pages
  EXPECT_TRUE(!std::is_sorted(first.begin(), first.end()));
  // A table too narrow for a sequence is left -1 where it ends, and the kernel's check names it.
  const std::vector<int> narrow = decode_block_table({40}, 16, 2, 6, 1);
  PagedDecodeProblem tight = problem({40}, 16);
  tight.max_pages = 2;
  EXPECT_CONTAINS(paged_decode_tables_invalid(tight, narrow, {40}), "cache_seqlens[0] = 40 is outside");
}
