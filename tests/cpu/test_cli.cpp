// flash_attn_mma's option parsing, its error messages and its results CSV.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "blocksparse/mods.h"
#include "blocksparse_mode.h"
#include "bwd_mode.h"
#include "cli.h"
#include "cli_flags.h"
#include "runner.h"
#include "table.h"
#include "testing.h"

using namespace attnlab;

namespace {
ParseResult parse(std::vector<std::string> args) { return parse_args(args); }

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh directory under /tmp, removed by the caller.
std::string temp_dir() {
  char name[] = "/tmp/attnlab_test_cli_XXXXXX";
  return mkdtemp(name) ? std::string(name) : std::string();
}
}  // namespace

TEST_CASE(cli_defaults_and_shape_flags) {
  const ParseResult r = parse({"--B", "2", "--H", "8", "--N", "8192", "--D", "64"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.common.B, 2);
  EXPECT_EQ(r.options.common.Nq, 8192);
  EXPECT_EQ(r.options.common.Nk, 8192);
  EXPECT_EQ(r.options.common.Dv, 64);
  EXPECT_TRUE(r.options.common.dtype == DType::kFloat16);
  EXPECT_TRUE(!r.options.common.causal && r.options.common.check && r.options.common.torch && r.options.common.sdpa);  // checks and peers on
  const AttnProblem p = to_problem(r.options.common);
  EXPECT_NEAR(p.scale, 0.125, 1e-7);
}

TEST_CASE(cli_nq_nk_dv_override) {
  const ParseResult r = parse({"--N=100", "--Nq", "17", "--Dv", "32", "--D", "128", "--dtype", "bf16", "--causal"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.common.Nq, 17);
  EXPECT_EQ(r.options.common.Nk, 100);
  EXPECT_EQ(r.options.common.D, 128);
  EXPECT_EQ(r.options.common.Dv, 32);
  EXPECT_TRUE(r.options.common.dtype == DType::kBFloat16);
  EXPECT_TRUE(r.options.common.causal);
}

TEST_CASE(cli_run_flags) {
  const ParseResult r = parse({"--iters", "5", "--warmup", "0", "--seed", "42", "--check", "--show-all", "--variant",
                               "split-q*", "--csv", "out.csv", "--torch"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.common.iters, 5);
  EXPECT_EQ(r.options.common.warmup, 0);
  EXPECT_EQ(r.options.common.seed, uint64_t(42));
  EXPECT_TRUE(r.options.common.seed_given && r.options.common.check && r.options.dense.show_all && r.options.common.torch);
  EXPECT_TRUE(!r.options.common.sdpa && r.options.common.peers_given);  // --torch picks the unfused group alone
  EXPECT_EQ(r.options.dense.variant_glob, std::string("split-q*"));
  EXPECT_EQ(r.options.common.csv, std::string("out.csv"));
}

TEST_CASE(cli_errors_name_the_problem) {
  EXPECT_CONTAINS(parse({"--D", "0"}).error, "--D must be between 1 and 1024");
  EXPECT_CONTAINS(parse({"--D", "2000"}).error, "--D must be between 1 and 1024");
  EXPECT_CONTAINS(parse({"--N", "-5"}).error, "--N must be between 1");
  EXPECT_CONTAINS(parse({"--dtype", "fp8"}).error, "--dtype must be fp16 or bf16, got 'fp8'");
  EXPECT_CONTAINS(parse({"--B", "abc"}).error, "--B expects an integer, got 'abc'");
  EXPECT_CONTAINS(parse({"--B", "3x"}).error, "--B expects an integer");
  EXPECT_CONTAINS(parse({"--H", "99999999999999999999"}).error, "--H must be between 1 and 65535");
  EXPECT_CONTAINS(parse({"--frobnicate"}).error, "unknown option '--frobnicate'");
  EXPECT_CONTAINS(parse({"--N"}).error, "--N needs a value");
  EXPECT_CONTAINS(parse({"--causal=1"}).error, "--causal takes no value");
  EXPECT_CONTAINS(parse({"--seed", "-1"}).error, "--seed expects a non-negative integer");
  EXPECT_CONTAINS(parse({"--iters", "0"}).error, "--iters must be between 1");
  for (const char* bad : {"--D", "--N", "--B", "--dtype", "--frobnicate"}) {
    const std::string e = parse({bad, "0"}).error;
    EXPECT_TRUE(!e.empty() && e.find('\n') == std::string::npos);  // one line
  }
}

TEST_CASE(cli_peers_reference_and_sweep) {
  const ParseResult r = parse({"--sdpa", "--check", "--reference", "torch", "--sweep", "--sweep-N", "1024,8192",
                               "--sweep-D", "64", "--sweep-causal", "1"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.common.sdpa && !r.options.common.torch && r.options.dense.torch_reference && r.options.dense.sweep);
  EXPECT_TRUE(r.options.dense.sweep_N == std::vector<int>({1024, 8192}));
  EXPECT_TRUE(r.options.dense.sweep_D == std::vector<int>({64}));
  EXPECT_TRUE(r.options.dense.sweep_causal == std::vector<int>({1}));
  const DenseOptions defaults = parse({}).options.dense;
  EXPECT_EQ(defaults.sweep_N.size(), size_t(6));
  EXPECT_EQ(defaults.sweep_D.back(), 1024);
  EXPECT_CONTAINS(parse({"--reference", "cpu"}).error, "--reference must be fp32 or torch");
  EXPECT_CONTAINS(parse({"--sweep", "--sweep-N", "1024,,2048"}).error, "--sweep-N expects an integer");
  EXPECT_CONTAINS(parse({"--sweep", "--sweep-D", "64,2048"}).error, "--sweep-D must be between 1 and 1024");
  EXPECT_CONTAINS(parse({"--sweep", "--sweep-causal", "2"}).error, "--sweep-causal must be between 0 and 1");
}

TEST_CASE(cli_hkv_is_a_dense_option) {
  // --Hkv alone: the dense ladder with GQA; the problem carries the KV heads.
  const ParseResult r = parse({"--H", "8", "--Hkv", "2", "--N", "100"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.program != Program::kDynamicMask);
  const AttnProblem p = to_problem(r.options.common);
  EXPECT_EQ(p.kv_heads(), 2);
  EXPECT_TRUE(p.gqa());
  EXPECT_EQ(p.kv_head(7), int64_t(1));
  EXPECT_TRUE(!to_problem(parse({"--H", "8"}).options.common).gqa());  // default: Hkv = H
  EXPECT_TRUE(parse({"--H", "8", "--Hkv", "1", "--sweep", "--check"}).ok());  // MQA over the sweep's grid
  EXPECT_TRUE(parse({"--H", "4", "--Hkv", "2", "--variant", "split-q*", "--show-all"}).ok());
  // --mask selects the dynamic-mask mode, where --Hkv keeps its meaning.
  EXPECT_TRUE(parse({"--H", "8", "--Hkv", "2", "--mask", "none"}).options.program == Program::kDynamicMask);
  EXPECT_EQ(parse({"--H", "8", "--Hkv", "2", "--mask", "none"}).options.common.Hkv, 2);
  // H % Hkv is checked in both modes.
  EXPECT_CONTAINS(parse({"--H", "8", "--Hkv", "3"}).error, "--H must be a multiple of --Hkv");
  EXPECT_CONTAINS(parse({"--H", "8", "--Hkv", "3", "--mask", "none"}).error, "--H must be a multiple of --Hkv");
  EXPECT_CONTAINS(parse({"--H", "2", "--Hkv", "4"}).error, "--H must be a multiple of --Hkv");
  EXPECT_CONTAINS(parse({"--Hkv", "0"}).error, "--Hkv must be between 1 and 65535");
  EXPECT_CONTAINS(usage(), "--Hkv N");
}

TEST_CASE(glob_matching) {
  EXPECT_TRUE(glob_match("*", "split-q+stage2"));
  EXPECT_TRUE(glob_match("split-q*", "split-q+stage1"));
  EXPECT_TRUE(glob_match("*stage?", "split-q+stage2"));
  EXPECT_TRUE(!glob_match("split-kv*", "split-q+stage2"));
  EXPECT_TRUE(glob_match("split-q+stage2", "split-q+stage2"));
  EXPECT_TRUE(!glob_match("split-q+stage", "split-q+stage2"));
  EXPECT_TRUE(glob_match("ws*,wgmma+stage2*", "wgmma+stage2+overlap"));  // comma: alternatives
  EXPECT_TRUE(glob_match("ws*,wgmma+stage2*", "ws+stage2"));
  EXPECT_TRUE(!glob_match("ws*,wgmma+stage2*", "wgmma+stage1"));
  EXPECT_TRUE(!glob_match("ws*,", "wgmma+stage1"));  // an empty alternative matches only an empty name
}

TEST_CASE(cli_dynamic_mask_flags) {
  const ParseResult r = parse({"--H", "2", "--Hkv", "1", "--N", "32768", "--D", "128", "--mask", "topk", "--window",
                               "1024", "--block", "0", "--bias", "--softcap", "30"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.program == Program::kDynamicMask);
  EXPECT_EQ(r.options.common.Hkv, 1);
  EXPECT_EQ(r.options.dynamic_mask.mask, std::string("topk"));
  EXPECT_EQ(r.options.dynamic_mask.window, 1024);
  EXPECT_EQ(r.options.dynamic_mask.block, 0);
  EXPECT_TRUE(r.options.dynamic_mask.bias);
  EXPECT_NEAR(r.options.dynamic_mask.softcap, 30.0, 1e-6);
  EXPECT_TRUE(parse({"--N", "64"}).options.program != Program::kDynamicMask);  // the dense harness by default
  EXPECT_EQ(parse({"--mask", "none"}).options.dynamic_mask.splits, 0);            // split-KV: automatic by default
  EXPECT_EQ(parse({"--mask", "none", "--splits", "16"}).options.dynamic_mask.splits, 16);
  EXPECT_CONTAINS(parse({"--mask", "none", "--splits", "-1"}).error, "--splits must be between 0 and 1024");
  const Options dmattn_bwd = parse({"--mask", "none", "--bias", "--bwd"}).options;
  EXPECT_TRUE(dmattn_bwd.common.bwd && dmattn_bwd.program == Program::kDynamicMask);  // dmattn's, not the dense one
  EXPECT_CONTAINS(parse({"--bwd=1"}).error, "--bwd takes no value");
  EXPECT_EQ(parse({"--bwd"}).options.dynamic_mask.bwd_chunks, 0);  // query chunks: automatic by default
  const Options chunks = parse({"--mask", "none", "--bwd-chunks", "7"}).options;
  EXPECT_TRUE(chunks.dynamic_mask.bwd_chunks == 7 && chunks.common.bwd);  // implies --bwd
  EXPECT_CONTAINS(parse({"--mask", "none", "--bwd-chunks", "5000"}).error, "--bwd-chunks must be between 0 and 4096");
  EXPECT_TRUE(!parse({"--bwd"}).options.dynamic_mask.bwd_own_prepass);  // default: the forward's mask summary
  EXPECT_TRUE(parse({"--mask", "ones", "--bwd-own-prepass"}).options.dynamic_mask.bwd_own_prepass &&
              parse({"--mask", "ones", "--bwd-own-prepass"}).options.common.bwd);
  EXPECT_CONTAINS(parse({"--bwd-own-prepass=1"}).error, "--bwd-own-prepass takes no value");
  EXPECT_TRUE(parse({"--mask", "ones", "--mask-bits"}).options.dynamic_mask.mask_bits &&
              parse({"--mask", "ones", "--mask-bits"}).options.program == Program::kDynamicMask);
  EXPECT_TRUE(!parse({"--mask", "ones"}).options.dynamic_mask.mask_bits);
  EXPECT_CONTAINS(parse({"--mask", "none", "--mask-bits"}).error, "--mask-bits packs the mask: add --mask ones or --mask topk");
  EXPECT_CONTAINS(parse({"--mask", "causal", "--mask-bits"}).error, "--mask-bits packs the mask");
  EXPECT_CONTAINS(parse({"--mask", "ones", "--mask-bits=1"}).error, "--mask-bits takes no value");
  const Options in_order = parse({"--mask", "none", "--bwd-walk-in-order"}).options;
  EXPECT_TRUE(!in_order.dynamic_mask.bwd_rotate && in_order.common.bwd);
  EXPECT_CONTAINS(parse({"--bwd-walk-in-order=1"}).error, "--bwd-walk-in-order takes no value");
  EXPECT_EQ(parse({"--mask", "none"}).options.dynamic_mask.dma_core, std::string("auto"));
  EXPECT_EQ(parse({"--mask", "none", "--dma-core", "mma"}).options.dynamic_mask.dma_core, std::string("mma"));
  EXPECT_CONTAINS(parse({"--mask", "none", "--dma-core", "tensor"}).error, "--dma-core must be auto, mma, wgmma, wgmma-cp.async or gather");
  EXPECT_EQ(parse({"--mask", "none"}).options.dynamic_mask.dma_mask_scan, std::string("auto"));
  EXPECT_EQ(parse({"--mask", "ones", "--dma-mask-scan", "in-kernel"}).options.dynamic_mask.dma_mask_scan,
            std::string("in-kernel"));
  EXPECT_CONTAINS(parse({"--mask", "none", "--dma-mask-scan", "fused"}).error,
                  "--dma-mask-scan must be auto, prepass, in-kernel or pipelined, got 'fused'");
  EXPECT_EQ(parse({"--mask", "ones", "--dma-mask-scan", "pipelined"}).options.dynamic_mask.dma_mask_scan,
            std::string("pipelined"));
  EXPECT_EQ(parse({"--mask", "ones", "--dma-prepass-chunks", "4"}).options.dynamic_mask.dma_prepass_chunks, 4);
  EXPECT_CONTAINS(parse({"--mask", "none", "--dma-prepass-chunks", "17"}).error, "--dma-prepass-chunks must be between 0 and 16");
  EXPECT_TRUE(parse({"--mask", "causal"}).options.common.causal);    // --mask causal implies --causal
  EXPECT_CONTAINS(parse({"--mask", "random"}).error, "--mask must be none, causal, ones or topk, got 'random'");
  EXPECT_CONTAINS(parse({"--H", "8", "--Hkv", "3"}).error, "--H must be a multiple of --Hkv");
  EXPECT_CONTAINS(parse({"--mask", "topk"}).error, "--mask topk selects keys by the bias: add --bias");
  EXPECT_CONTAINS(parse({"--mask", "none", "--softcap", "-1"}).error, "--softcap expects a number from 0 to 1e6 (0: off), got '-1'");
  EXPECT_CONTAINS(parse({"--mask", "none", "--softcap", "x"}).error, "--softcap expects a number from 0 to 1e6");
  EXPECT_CONTAINS(parse({"--mask", "none", "--Dv", "32"}).error, "dynamic-mask attention needs Dv == D");
}

TEST_CASE(cli_numbers_are_strict) {
  // The whole string, decimal digits (and a leading '-' for the range message), in range.
  EXPECT_CONTAINS(parse({"--seed", " -1"}).error, "--seed expects a non-negative integer, got ' -1'");
  EXPECT_CONTAINS(parse({"--seed", "-1"}).error, "--seed expects a non-negative integer, got '-1'");
  EXPECT_CONTAINS(parse({"--seed", "+5"}).error, "--seed expects a non-negative integer");
  EXPECT_CONTAINS(parse({"--seed", "18446744073709551616"}).error, "--seed must be at most 18446744073709551615");
  EXPECT_EQ(parse({"--seed", "18446744073709551615"}).options.common.seed, UINT64_MAX);
  EXPECT_EQ(parse({"--seed", "0"}).options.common.seed, uint64_t(0));
  EXPECT_CONTAINS(parse({"--B", "1x"}).error, "--B expects an integer, got '1x'");
  EXPECT_CONTAINS(parse({"--B", ""}).error, "--B expects an integer, got ''");
  EXPECT_CONTAINS(parse({"--B="}).error, "--B expects an integer, got ''");
  EXPECT_CONTAINS(parse({"--B", " 2"}).error, "--B expects an integer, got ' 2'");
  EXPECT_CONTAINS(parse({"--B", "+2"}).error, "--B expects an integer");
  EXPECT_CONTAINS(parse({"--B", "0x10"}).error, "--B expects an integer");
  EXPECT_CONTAINS(parse({"--B", "-"}).error, "--B expects an integer");
  EXPECT_CONTAINS(parse({"--N", "99999999999"}).error, "--N must be between 1 and 1073741824, got 99999999999");
  EXPECT_CONTAINS(parse({"--N", "-99999999999999999999"}).error, "--N must be between 1 and 1073741824");
  EXPECT_CONTAINS(parse({"--iters", "100001"}).error, "--iters must be between 1 and 100000");
  for (const char* bad : {"nan", "NaN", "inf", "-1", " 1", "1 ", "", "1e7", "0x10", "1,5", "+1"})
    EXPECT_CONTAINS(parse({"--mask", "none", "--softcap", bad}).error, "--softcap expects a number from 0 to 1e6");
  EXPECT_NEAR(parse({"--mask", "none", "--softcap", "0.5"}).options.dynamic_mask.softcap, 0.5, 1e-7);
  EXPECT_NEAR(parse({"--mask", "none", "--softcap", "1e3"}).options.dynamic_mask.softcap, 1000.0, 1e-3);
  EXPECT_NEAR(parse({"--mask", "none", "--softcap", ".5"}).options.dynamic_mask.softcap, 0.5, 1e-7);
}

TEST_CASE(cli_repeated_options) {
  EXPECT_CONTAINS(parse({"--D", "64", "--D", "128"}).error, "--D given twice");
  EXPECT_CONTAINS(parse({"--D=64", "--D", "64"}).error, "--D given twice");
  EXPECT_CONTAINS(parse({"--iters", "5", "--iters", "5"}).error, "--iters given twice");
  EXPECT_CONTAINS(parse({"--causal", "--causal"}).error, "--causal given twice");
  EXPECT_CONTAINS(parse({"--show", "--show-all"}).error, "--show-all given twice");  // one option, two spellings
  EXPECT_CONTAINS(parse({"--mask", "none", "--bias", "--bias"}).error, "--bias given twice");
  EXPECT_TRUE(parse({"--N", "64", "--Nq", "1"}).ok());  // different options
}

TEST_CASE(cli_options_that_need_another) {
  // --N with both --Nq and --Nk would be ignored.
  EXPECT_CONTAINS(parse({"--N", "64", "--Nq", "1", "--Nk", "2"}).error, "--N has no effect with both --Nq and --Nk");
  // The sweep's grid options need --sweep; the grid sets N, D and causal itself.
  EXPECT_CONTAINS(parse({"--sweep-N", "1024"}).error, "--sweep-N needs --sweep");
  EXPECT_CONTAINS(parse({"--sweep-D", "64"}).error, "--sweep-D needs --sweep");
  EXPECT_CONTAINS(parse({"--sweep-causal", "0"}).error, "--sweep-causal needs --sweep");
  for (const char* f : {"--N", "--Nq", "--Nk", "--D", "--Dv"})
    EXPECT_CONTAINS(parse({"--sweep", f, "64"}).error, std::string(f) + " does not apply to --sweep");
  EXPECT_CONTAINS(parse({"--sweep", "--causal"}).error, "--causal does not apply to --sweep");
  EXPECT_CONTAINS(parse({"--sweep", "--show-all"}).error, "--show-all does not apply to --sweep");
  EXPECT_TRUE(parse({"--sweep", "--B", "2", "--H", "4", "--dtype", "bf16", "--check"}).ok());
  // The reference is what the check compares against: on by default.
  EXPECT_TRUE(parse({"--reference", "torch"}).ok() && parse({"--reference", "torch"}).options.dense.torch_reference);
  EXPECT_CONTAINS(parse({"--no-check", "--reference", "fp32"}).error, "--reference does not apply with --no-check");
  EXPECT_TRUE(parse({"--check", "--reference", "fp32"}).ok());
  // The top-W mask's parameters.
  EXPECT_CONTAINS(parse({"--mask", "none", "--window", "64"}).error, "--window needs --mask topk");
  EXPECT_CONTAINS(parse({"--mask", "none", "--block", "0"}).error, "--block needs --mask topk");
  EXPECT_CONTAINS(parse({"--mask", "ones", "--window", "64"}).error, "--window needs --mask topk");
  EXPECT_TRUE(parse({"--mask", "topk", "--bias", "--window", "64", "--block", "0"}).ok());
  // Options that read the mask need one.
  EXPECT_CONTAINS(parse({"--mask", "none", "--dma-mask-scan", "prepass"}).error,
                  "--dma-mask-scan reads the mask: add --mask ones or --mask topk");
  EXPECT_CONTAINS(parse({"--mask", "causal", "--dma-prepass-chunks", "2"}).error,
                  "--dma-prepass-chunks reads the mask");
  EXPECT_CONTAINS(parse({"--mask", "none", "--bwd-own-prepass"}).error, "--bwd-own-prepass reads the mask");
  EXPECT_CONTAINS(parse({"--mask", "ones", "--dma-mask-scan", "in-kernel", "--dma-prepass-chunks", "2"}).error,
                  "--dma-prepass-chunks needs --dma-mask-scan pipelined or auto, not in-kernel");
  EXPECT_TRUE(parse({"--mask", "ones", "--dma-mask-scan", "pipelined", "--dma-prepass-chunks", "2"}).ok());
  EXPECT_CONTAINS(parse({"--mask", "none", "--dma-core", "gather"}).error, "--dma-core gather needs one query row (--Nq 1) and a mask");
  EXPECT_CONTAINS(parse({"--Nq", "1", "--mask", "none", "--dma-core", "gather"}).error, "--dma-core gather needs one query row");
  EXPECT_CONTAINS(parse({"--Nq", "2", "--mask", "ones", "--dma-core", "gather"}).error, "--dma-core gather needs");
  EXPECT_TRUE(parse({"--Nq", "1", "--mask", "ones", "--dma-core", "gather"}).ok());
  EXPECT_CONTAINS(parse({"--mask", "none", "--deterministic", "--bwd-chunks", "4"}).error,
                  "--bwd-chunks does not apply to --deterministic, which always runs one chunk");
  // One line each.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--window", "1"}, {"--D", "1", "--D", "2"}, {"--sweep-N", "1"}, {"--seed", " 1"}})
    EXPECT_TRUE(parse(args).error.find('\n') == std::string::npos && !parse(args).error.empty());
}

TEST_CASE(cli_bwd_alone_is_the_dense_backward) {
  // --bwd without --mask or --mask-mod: the dense backward on the shape given.
  const ParseResult r = parse({"--bwd", "--D", "64"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.common.bwd && r.options.program == Program::kDenseBackward);
  EXPECT_TRUE(parse({"--D", "64"}).options.program != Program::kDenseBackward);  // the forward by default
  // Every dense shape option applies: GQA, Nq != Nk, D != Dv, bf16, causal; and the rows' options.
  const ParseResult full = parse({"--bwd", "--B", "4", "--H", "16", "--Hkv", "4", "--Nq", "300", "--Nk", "1000", "--D",
                                  "192", "--Dv", "128", "--dtype", "bf16", "--causal", "--variant", "bwd-ws*",
                                  "--show-all", "--csv", "/tmp/x.csv", "--no-peers"});
  EXPECT_TRUE(full.ok() && full.options.program == Program::kDenseBackward);
  const AttnProblem p = to_problem(full.options.common);
  EXPECT_TRUE(p.gqa() && p.Nq == 300 && p.Nk == 1000 && p.D == 192 && p.Dv == 128 && p.causal);
  EXPECT_TRUE(parse({"--bwd", "--sdpa", "--torch"}).options.program == Program::kDenseBackward);
  EXPECT_TRUE(parse({"--bwd", "--list"}).options.program == Program::kDenseBackward);
  // With --mask, the dynamic-mask mode's backward (its backward options imply --bwd there).
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--mask", "none", "--bwd-chunks", "2"}, {"--mask", "none", "--bwd-walk-in-order"},
        {"--bwd", "--mask", "none"}, {"--bwd", "--mask", "causal"}, {"--bwd", "--mask", "ones", "--softcap", "0"}}) {
    const Options o = parse(args).options;
    EXPECT_TRUE(parse(args).ok() && o.common.bwd && o.program == Program::kDynamicMask);
  }
  // What it cannot take: one line each, before anything runs.
  EXPECT_EQ(parse({"--bwd", "--sweep"}).error,
            std::string("--sweep is an option of the dense forward; this run is the dense backward (--bwd)"));
  EXPECT_CONTAINS(parse({"--bwd", "--reference", "torch"}).error, "--reference is an option of the dense forward;");
  EXPECT_CONTAINS(parse({"--bwd", "--H", "8", "--Hkv", "3"}).error, "--H must be a multiple of --Hkv");
  EXPECT_CONTAINS(parse({"--bwd", "--mask", "none", "--Dv", "32"}).error, "dynamic-mask attention needs Dv == D");
  EXPECT_CONTAINS(parse({"--bwd", "--bwd"}).error, "--bwd given twice");
  const std::string u = usage();
  EXPECT_CONTAINS(u, "--bwd             the program's backward instead of its forward");
  EXPECT_CONTAINS(u, "the dense backward (--bwd):\n  Every backward rung");
}

TEST_CASE(cli_checks_and_peers_are_on_by_default) {
  const CommonOptions d = parse({"--B", "1", "--H", "8", "--N", "8192", "--D", "512"}).options.common;
  EXPECT_TRUE(d.check && d.torch && d.sdpa && !d.peers_given);
  EXPECT_TRUE(parse({"--check"}).options.common.check);  // still accepted
  EXPECT_TRUE(!parse({"--no-check"}).options.common.check);
  const CommonOptions none = parse({"--no-peers"}).options.common;
  EXPECT_TRUE(!none.torch && !none.sdpa && none.check);
  const CommonOptions quick = parse({"--no-check", "--no-peers"}).options.common;
  EXPECT_TRUE(!quick.check && !quick.torch && !quick.sdpa);
  // --torch and --sdpa pick groups: only those given.
  const CommonOptions sdpa = parse({"--sdpa"}).options.common;
  EXPECT_TRUE(sdpa.sdpa && !sdpa.torch && sdpa.peers_given);
  const CommonOptions both = parse({"--torch", "--sdpa"}).options.common;
  EXPECT_TRUE(both.sdpa && both.torch);
  // Contradictions: one line each.
  EXPECT_CONTAINS(parse({"--check", "--no-check"}).error, "--check and --no-check contradict each other");
  EXPECT_CONTAINS(parse({"--no-peers", "--torch"}).error, "--torch and --no-peers contradict each other");
  EXPECT_CONTAINS(parse({"--sdpa", "--no-peers"}).error, "--sdpa and --no-peers contradict each other");
  EXPECT_CONTAINS(parse({"--no-check=1"}).error, "--no-check takes no value");
  EXPECT_CONTAINS(parse({"--no-peers", "--no-peers"}).error, "--no-peers given twice");
  // The same defaults in the dynamic-mask mode.
  const Options dma = parse({"--mask", "ones", "--bwd"}).options;
  EXPECT_TRUE(dma.program == Program::kDynamicMask && dma.common.check && dma.common.torch && dma.common.sdpa);
  EXPECT_TRUE(!parse({"--mask", "none", "--no-check", "--no-peers"}).options.common.check);
  EXPECT_CONTAINS(parse({"--mask", "none", "--no-check", "--check"}).error, "contradict");
  const std::string u = usage();
  EXPECT_CONTAINS(u, "--no-check");
  EXPECT_CONTAINS(u, "--no-peers");
}

TEST_CASE(cli_usage_documents_exit_codes_and_rules) {
  const std::string u = usage();
  EXPECT_CONTAINS(u, "exit status: 0");
  EXPECT_CONTAINS(u, "1 a check failed");
  EXPECT_CONTAINS(u, "options (nothing ran)");
  EXPECT_CONTAINS(u, "3 no usable CUDA GPU");
  EXPECT_CONTAINS(u, "each option once");
  EXPECT_CONTAINS(u,
                  "--mask-mod selects\nblock-sparse attention, --mask dynamic-mask attention, --varlen "
                  "variable-length\nattention, --decode paged decoding, none of them the dense forward");
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitFailed, 1);
  EXPECT_EQ(kExitBadOptions, 2);
  EXPECT_EQ(kExitNoGpu, 3);
}

TEST_CASE(results_csv_unwritable_paths_are_found_first) {
  EXPECT_CONTAINS(results_csv_error("/nonexistent/dir/x.csv"),
                  "cannot write --csv /nonexistent/dir/x.csv: No such file or directory");
  const std::string dir = temp_dir();
  EXPECT_TRUE(!dir.empty());
  EXPECT_CONTAINS(results_csv_error(dir), "cannot write --csv " + dir + ": it is a directory");
  // A writable new path passes and is not left behind; an existing file is kept as it was.
  const std::string path = dir + "/rows.csv";
  EXPECT_EQ(results_csv_error(path), std::string());
  EXPECT_TRUE(!exists(path));
  EXPECT_EQ(append_results_csv(path, "row1\n"), std::string());
  EXPECT_EQ(append_results_csv(path, "row2\n"), std::string());
  const std::string text = read_file(path);
  EXPECT_EQ(text.rfind("gpu,driver,cuda,commit,date,variant,kind,", 0), size_t(0));  // the header first, once
  EXPECT_CONTAINS(text, ",seed,note\nrow1\nrow2\n");
  EXPECT_EQ(results_csv_error(path), std::string());
  EXPECT_EQ(read_file(path), text);
  if (getuid() != 0) {  // root writes anywhere
    chmod(path.c_str(), 0444);
    EXPECT_CONTAINS(results_csv_error(path), "cannot write --csv " + path + ": Permission denied");
    EXPECT_CONTAINS(append_results_csv(path, "row3\n"), "its rows are lost");
    chmod(path.c_str(), 0644);
  }
  std::remove(path.c_str());
  rmdir(dir.c_str());
  // Every write is checked: a device that is always full loses the rows, and says so.
  if (exists("/dev/full")) {
    EXPECT_EQ(results_csv_error("/dev/full"), std::string());  // it opens ...
    EXPECT_CONTAINS(append_results_csv("/dev/full", "row\n"),
                    "writing --csv /dev/full failed: No space left on device");
  }
}

TEST_CASE(table_rows_are_scored_in_order) {
  // Peers first: the best peer that did not FAIL is what the rungs' ratios divide by.
  auto row = [](const char* name, bool peer, double ms, bool pass) {
    TableRow r;
    r.name = name;
    r.is_peer = peer;
    r.timing.median_ms = ms;
    r.checked = true;
    r.pass = pass;
    r.check_note = pass ? "PASS" : "FAIL";
    return r;
  };
  std::vector<TableRow> rows = {row("fast-but-wrong bwd", true, 1.0, false), row("sdpa(cudnn) bwd", true, 2.0, true),
                                row("bwd-mma", false, 4.0, true), row("bwd-ws", false, 1.6, false)};
  TableRow unsupported;
  unsupported.name = "bwd-ws+deterministic bwd";
  unsupported.status = "unsupported";
  rows.push_back(unsupported);
  TableRow broken = row("bwd-mma+deterministic bwd", false, 0, true);
  broken.error = "an illegal memory access";
  rows.push_back(broken);
  const TableScore score = score_rows(rows, 2e12);  // 2 TFLOP: TFLOPS = 2000 / ms
  EXPECT_EQ(score.best_peer_name, std::string("sdpa(cudnn) bwd"));
  EXPECT_NEAR(score.best_peer_tflops, 1000.0, 1e-9);
  EXPECT_EQ(score.failures, 2);  // the failed rung and the one that errored; never a peer
  EXPECT_EQ(rows[0].status, std::string("FAIL"));
  EXPECT_NEAR(rows[2].ratio_to_best_peer, 0.5, 1e-12);
  EXPECT_NEAR(rows[3].ratio_to_best_peer, 1.25, 1e-12);
  EXPECT_TRUE(rows[3].gain_pct < 0);  // slower than the wrong peer before it
  EXPECT_EQ(rows[4].status, std::string("unsupported"));
  EXPECT_EQ(rows[5].status, std::string("error"));
  EXPECT_EQ(rows[5].note, std::string("an illegal memory access"));
}

TEST_CASE(backward_rows_in_the_results_csv) {
  // The forward's columns; a backward row's err and tol are its worst gradient's, lse_err empty.
  GradCheck c;
  const double errs[kGrads] = {1e-3, 4e-3, 1e-4}, tols[kGrads] = {2e-3, 5e-3, 2e-3};
  for (int g = 0; g < kGrads; ++g) {
    c.grad[g].err = errs[g];
    c.grad[g].tol = tols[g];
    c.grad[g].pass = true;
  }
  c.pass = true;
  EXPECT_EQ(c.worst(), 1);  // 0.8 of its bound
  EXPECT_EQ(c.summary(),
            std::string("PASS dQ 1.00e-03 <= 2.00e-03, dK 4.00e-03 <= 5.00e-03, dV 1.00e-04 <= 2.00e-03"));
  c.grad[2].nonfinite = 3;
  EXPECT_CONTAINS(c.summary(), "dV 3 NaN/Inf/unwritten");
  TableRow r;
  r.name = "bwd-ws";
  r.timing.median_ms = 0.5;
  r.checked = true;
  r.pass = true;
  r.err = 4e-3;
  r.tol = 5e-3;
  r.check_note = "PASS dQ ...";
  std::vector<TableRow> rows = {r};
  score_rows(rows, 1e9);  // 2 TFLOPS in 0.5 ms
  const std::string dir = temp_dir();
  const std::string path = dir + "/bwd.csv";
  SystemInfo sys;
  sys.gpu = "NVIDIA H200";
  AttnProblem p;
  p.B = 2;
  p.H = 4;
  p.Hkv = 2;
  p.Nq = 300;
  p.Nk = 1000;
  p.D = 192;
  p.Dv = 128;
  p.dtype = DType::kBFloat16;
  p.causal = true;
  EXPECT_EQ(append_rows_csv(path, sys, p, 7, rows), std::string());
  const std::string text = read_file(path);
  EXPECT_CONTAINS(text, ",bwd-ws,rung,2,4,300,1000,192,128,bf16,1,0.500000,2.00,,PASS,4.000e-03,5.000e-03,,7,"
                        "Hkv=2; PASS dQ ...\n");
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST_CASE(cli_blocksparse_flags) {
  ParseResult r = parse({"--mask-mod", "sliding_window:128,0", "--score-mod", "softcap:30", "--block-size", "256",
                         "--Hkv", "2"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.program == Program::kBlocksparse);
  EXPECT_EQ(r.options.blocksparse.block_q, 256);
  EXPECT_EQ(r.options.blocksparse.block_kv, 256);
  r = parse({"--mask-mod", "document:7", "--block-size", "128,256", "--N", "1000"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.blocksparse.document_count, 7);
  EXPECT_EQ(r.options.blocksparse.block_q, 128);
  EXPECT_EQ(r.options.blocksparse.block_kv, 256);
  r = parse({"--mask-mod", "document", "--N", "3"});  // the default count, at most the length
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.blocksparse.document_count, 3);
  // One line naming the problem for each bad spec or combination.
  EXPECT_CONTAINS(parse({"--mask-mod", "causal:1"}).error, "--mask-mod: unknown mask_mod 'causal:1'");
  EXPECT_CONTAINS(parse({"--mask-mod", "block_diagonal:0"}).error, "needs a block >= 1");
  EXPECT_CONTAINS(parse({"--mask-mod", "document:0"}).error, "--mask-mod document:K takes K documents");
  EXPECT_CONTAINS(parse({"--mask-mod", "causal", "--score-mod", "softcap:-1"}).error,
                  "--score-mod: score_mod softcap takes C > 0");
  EXPECT_CONTAINS(parse({"--mask-mod", "causal", "--block-size", "0"}).error, "--block-size must be between 1");
  EXPECT_CONTAINS(parse({"--mask-mod", "causal", "--mask", "ones"}).error, "select two programs");
  EXPECT_CONTAINS(parse({"--mask-mod", "causal", "--sdpa", "--torch"}).error, "--torch is an option of");
  EXPECT_EQ(parse({"--mask-mod", "causal", "--bwd"}).error, std::string(""));  // the block-sparse backward
}

TEST_CASE(cli_deterministic_is_the_deterministic_backward_of_each_mode) {
  // Alone or with --bwd: the dense backward, its deterministic rungs alone.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--deterministic"}, {"--bwd", "--deterministic"}}) {
    const ParseResult r = parse(args);
    EXPECT_TRUE(r.ok() && r.options.program == Program::kDenseBackward);
    EXPECT_TRUE(r.options.common.bwd && r.options.common.deterministic);
  }
  const Options dense = parse({"--deterministic", "--no-peers"}).options;
  size_t rungs = 0;
  const std::vector<const BwdVariant*> rows = backward_rows(dense.common, dense.dense, &rungs);
  size_t deterministic_rungs = 0;
  for (const BwdVariant& v : all_bwd_variants()) deterministic_rungs += v.deterministic ? 1 : 0;
  EXPECT_TRUE(deterministic_rungs > 0 && rungs == deterministic_rungs && rows.size() == rungs);
  for (const BwdVariant* v : rows) EXPECT_TRUE(v->deterministic);
  const Options narrowed = parse({"--deterministic", "--no-peers", "--variant", "bwd-mma*"}).options;
  EXPECT_EQ(backward_rows(narrowed.common, narrowed.dense, &rungs).size(), size_t(1));
  // Dynamic-mask attention: dmattn's deterministic mode.
  const ParseResult dm = parse({"--mask", "ones", "--deterministic"});
  EXPECT_TRUE(dm.ok() && dm.options.program == Program::kDynamicMask && dm.options.common.bwd &&
              dm.options.common.deterministic);
  // Block-sparse attention: blocksparse-det bwd alone.
  const ParseResult bs = parse({"--mask-mod", "causal", "--deterministic", "--no-peers"});
  EXPECT_TRUE(bs.ok() && bs.options.program == Program::kBlocksparse && bs.options.common.bwd);
  const std::vector<ListEntry> list = blocksparse_list(bs.options.common);
  EXPECT_TRUE(list.size() == 1 && list[0].name == "blocksparse-det bwd");
  EXPECT_EQ(blocksparse_list(parse({"--mask-mod", "causal", "--bwd", "--no-peers"}).options.common).size(), size_t(2));
}

namespace {
// What selects each program on a command line.
std::vector<std::string> selecting(Program p) {
  switch (p) {
    case Program::kDenseForward: return {};
    case Program::kDenseBackward: return {"--bwd"};
    case Program::kDynamicMask: return {"--mask", "none"};
    case Program::kBlocksparse: return {"--mask-mod", "causal"};
    case Program::kVarlen: return {"--varlen", "4"};
    case Program::kDecode: return {"--decode", "4"};
  }
  return {};
}
}  // namespace

TEST_CASE(cli_each_flag_belongs_to_its_programs) {
  // Every flag of the table, after each program's selector: taken where it belongs (its value may still be
  // wrong: "1" is not every flag's), refused in one line that says whose it is everywhere else; each program
  // refuses one flag at least.
  Programs refusing = 0;
  for (const Flag& f : flag_table())
    for (const ProgramInfo& info : program_table()) {
      std::vector<std::string> args = selecting(info.program);
      if (!args.empty() && args[0] == f.name) continue;  // the selector itself
      args.push_back(f.name);
      if (!f.value.empty()) args.push_back("1");
      const ParseResult r = parse(args);
      const bool selector = f.name == "--mask" || f.name == "--mask-mod" || f.name == "--varlen" ||
                            f.name == "--decode";
      if (f.programs & program_bit(r.options.program)) {  // the flag may select the program itself (--bwd, --mask)
        EXPECT_TRUE(r.error.rfind(f.name + " is an option of ", 0) != 0);
      } else if (selector) {
        EXPECT_CONTAINS(r.error, " select two programs (");
      } else {
        EXPECT_EQ(r.error.rfind(f.name + " is an option of ", 0), size_t(0));
        EXPECT_CONTAINS(r.error, "; this run is " + program_info(r.options.program).name);
        EXPECT_TRUE(r.error.find('\n') == std::string::npos);
        refusing |= program_bit(r.options.program);
      }
    }
  EXPECT_EQ(refusing, kEveryProgram);
  // The messages, whole.
  EXPECT_EQ(parse({"--mask-mod", "causal", "--score-mod", "alibi", "--window", "8"}).error,
            std::string("--window is an option of dynamic-mask attention (--mask M); this run is block-sparse "
                        "attention (--mask-mod M)"));
  EXPECT_EQ(parse({"--mask", "ones", "--show-all"}).error,
            std::string("--show-all is an option of the dense forward and the dense backward; this run is "
                        "dynamic-mask attention (--mask M)"));
  EXPECT_EQ(parse({"--mask-mod", "causal", "--causal"}).error,
            std::string("--causal is an option of every program but block-sparse attention; this run is block-sparse "
                        "attention (--mask-mod M); block-sparse attention's causal mask is --mask-mod causal"));
  // What a program has instead is said to that program alone.
  EXPECT_EQ(parse({"--varlen", "4", "--torch"}).error,
            std::string("--torch is an option of the dense forward, the dense backward and dynamic-mask attention; "
                        "this run is variable-length attention (--varlen LENGTHS); variable-length attention has no "
                        "peers (its dense padded row is a yardstick)"));
  EXPECT_EQ(parse({"--score-mod", "alibi"}).error,
            std::string("--score-mod is an option of block-sparse attention (--mask-mod M); this run is the dense "
                        "forward"));
  // Before any value is read: the flag of the wrong program, not its value, is the error.
  EXPECT_CONTAINS(parse({"--bwd", "--sweep-N", "x"}).error, "--sweep-N is an option of the dense forward");
  // The program each selector picks; --bwd and the flags that imply it pick the backward.
  EXPECT_TRUE(parse({}).options.program == Program::kDenseForward);
  EXPECT_TRUE(parse({"--bwd"}).options.program == Program::kDenseBackward);
  const Options masked = parse({"--mask", "ones"}).options;
  EXPECT_TRUE(masked.program == Program::kDynamicMask && !masked.common.bwd);
  EXPECT_TRUE(parse({"--mask", "ones", "--bwd-chunks", "2"}).options.common.bwd);
  EXPECT_TRUE(parse({"--mask-mod", "none"}).options.program == Program::kBlocksparse);
  EXPECT_TRUE(parse({"--mask-mod", "none", "--bwd"}).options.common.bwd);
}

TEST_CASE(cli_help_is_written_from_the_table) {
  // Every flag once, as "  NAME VALUE" at the start of a line, in the section of the programs it belongs to.
  const std::string u = usage(), options = u.substr(u.find("\noptions of "));
  std::set<std::string> names;
  for (const Flag& f : flag_table()) {
    EXPECT_TRUE(names.insert(f.name).second && !f.help.empty() && f.programs != 0 && f.set);
    const std::string item = "\n  " + f.name + (f.value.empty() ? "" : " " + f.value);
    size_t count = 0;
    for (size_t at = options.find(item); at != std::string::npos; at = options.find(item, at + 1))
      if (options[at + item.size()] == ' ' || options[at + item.size()] == '\n') ++count;
    EXPECT_EQ(count, size_t(1));
    if (count != 1) std::printf("  %s: listed %zu times\n", f.name.c_str(), count);
    EXPECT_TRUE(f.alias.empty() || options.find("\n  " + f.alias + " ") == std::string::npos);
  }
  // A section per set of programs, and a paragraph per program.
  for (const char* heading : {"\noptions of every program:\n  --H N",
                              "\noptions of every program but variable-length attention and paged decoding:\n  --B N",
                              "\noptions of every program but variable-length attention:\n  --Nq N",
                              "\noptions of every program but block-sparse attention:\n  --causal",
                              "\noptions of the dense forward:\n  --reference R",
                              "\noptions of dynamic-mask attention (--mask M):\n  --mask M",
                              "\noptions of block-sparse attention (--mask-mod M):\n  --mask-mod M",
                              "\noptions of variable-length attention (--varlen LENGTHS):\n  --varlen LENGTHS",
                              "\noptions of paged decoding (--decode LENGTHS):\n  --decode LENGTHS",
                              "\nthe dense forward:\n  Rows:", "\nthe dense backward (--bwd):\n",
                              "\ndynamic-mask attention (--mask M):\n", "\nblock-sparse attention (--mask-mod M):\n",
                              "\nvariable-length attention (--varlen LENGTHS):\n",
                              "\npaged decoding (--decode LENGTHS):\n"})
    EXPECT_CONTAINS(u, heading);
  // Lines of 80 columns at most, but the synopsis' examples.
  std::istringstream lines(u.substr(u.find("\nSix programs")));
  for (std::string line; std::getline(lines, line);) {
    size_t columns = 0;  // characters, not bytes ('·')
    for (unsigned char ch : line) columns += (ch & 0xC0) != 0x80;
    EXPECT_TRUE(columns <= 80);
    if (columns > 80) std::printf("  too long: %s\n", line.c_str());
  }
}

TEST_CASE(blocksparse_document_ids) {
  // K documents of lengths >= 1 covering the sequence, ids 0 .. K-1 in order, one set per batch.
  for (const int K : {1, 2, 4, 17, 64}) {
    const int B = 3, L = 64;
    const std::vector<int32_t> ids = random_document_ids(B, L, K, 11);
    EXPECT_EQ(ids.size(), size_t(B * L));
    for (int b = 0; b < B; ++b) {
      EXPECT_EQ(ids[size_t(b) * L], 0);
      EXPECT_EQ(ids[size_t(b) * L + L - 1], K - 1);
      for (int i = 1; i < L; ++i) {
        const int step = ids[size_t(b) * L + i] - ids[size_t(b) * L + i - 1];
        EXPECT_TRUE(step == 0 || step == 1);
      }
    }
  }
  EXPECT_TRUE(random_document_ids(2, 1000, 4, 1) == random_document_ids(2, 1000, 4, 1));  // from the seed
  EXPECT_TRUE(random_document_ids(2, 1000, 4, 1) != random_document_ids(2, 1000, 4, 2));
}

TEST_CASE(blocksparse_rows_in_their_csv) {
  // The block-sparse rows' CSV: the results columns and mask, score; a file of other columns is refused.
  const std::string dir = temp_dir();
  const std::string path = dir + "/bs.csv";
  EXPECT_EQ(append_results_csv(path, "row1,causal,alibi\n", kBlocksparseCsvColumns), std::string());
  EXPECT_CONTAINS(read_file(path), ",seed,note,mask,score\nrow1,causal,alibi\n");
  EXPECT_EQ(results_csv_error(path, kBlocksparseCsvColumns), std::string());
  EXPECT_CONTAINS(results_csv_error(path), "its columns are not these rows' (the results schema)");
  const std::string plain = dir + "/plain.csv";
  EXPECT_EQ(append_results_csv(plain, "row\n"), std::string());
  EXPECT_CONTAINS(results_csv_error(plain, kBlocksparseCsvColumns), "(the results schema and mask,score)");
  std::remove(path.c_str());
  std::remove(plain.c_str());
  rmdir(dir.c_str());
}

TEST_CASE(cli_help_wins_over_every_other_option) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help", "--D", "0"}, {"--D", "0", "-h"}, {"--bogus", "--help"}, {"--help", "--mask-mod", "tensor"}}) {
    const ParseResult r = parse(args);
    EXPECT_TRUE(r.ok() && r.options.common.help);
  }
}

TEST_CASE(cli_usage_starts_with_a_synopsis) {
  // The first thirteen lines: how to call it, one line per family, the exit codes.
  const std::string u = usage();
  size_t at = 0;
  for (int line = 0; line < 13 && at != std::string::npos; ++line) at = u.find('\n', at + 1);
  const std::string head = u.substr(0, at);
  for (const char* s : {"usage: flash_attn_mma", "--B 1 --H 8 --N 8192 --D 128", "--bwd", "--mask topk",
                        "--mask-mod", "--varlen", "--decode", "--list",
                        "exit status: 0 ok, 1 a check or the run failed, 2 bad options, 3"})
    EXPECT_CONTAINS(head, s);
}

TEST_CASE(cli_hkv_error_gives_the_values) {
  EXPECT_EQ(parse({"--H", "8", "--Hkv", "3"}).error, std::string("--H must be a multiple of --Hkv, got --H 8 and --Hkv 3"));
  EXPECT_EQ(parse({"--Hkv", "3"}).error, std::string("--H must be a multiple of --Hkv, got --H 8 and --Hkv 3"));
}

TEST_CASE(cli_blocksparse_lists_only_what_the_harness_runs) {
  // The mods that read a caller's tensor: one plain sentence, and never offered in a list.
  const std::string tensor = parse({"--mask-mod", "tensor"}).error;
  EXPECT_CONTAINS(tensor, "--mask-mod tensor reads a keep tensor, which the harness does not make");
  EXPECT_CONTAINS(tensor, "the harness's mask_mods: none, causal,");
  const std::string bias = parse({"--mask-mod", "causal", "--score-mod", "bias"}).error;
  EXPECT_CONTAINS(bias, "--score-mod bias reads a bias tensor, which the harness does not make");
  EXPECT_CONTAINS(bias, "the harness's score_mods: none, rel_bias, alibi, softcap:C");
  const std::string mask = parse({"--mask-mod", "foo"}).error, score = parse({"--mask-mod", "causal", "--score-mod", "x"}).error;
  EXPECT_CONTAINS(mask, "--mask-mod: unknown mask_mod 'foo' (none, causal,");
  EXPECT_CONTAINS(score, "--score-mod: unknown score_mod 'x' (none, rel_bias, alibi, softcap:C)");
  for (const std::string& e : {tensor, bias, mask, score}) {
    EXPECT_TRUE(e.find(", tensor") == std::string::npos && e.find(", bias") == std::string::npos);
    EXPECT_TRUE(e.find('\n') == std::string::npos);
  }
  // The library's own lists, which attnlab.flex_attention answers with, keep them.
  EXPECT_CONTAINS(mask_mod_names(true), "document, tensor");
  EXPECT_CONTAINS(score_mod_names(true), "softcap:C, bias");
}

TEST_CASE(cli_blocksparse_block_size_is_checked_without_a_gpu) {
  auto why = [](std::vector<std::string> args) {
    const ParseResult r = parse(args);
    EXPECT_TRUE(r.ok());
    return blocksparse_options_unsupported(r.options.common, r.options.blocksparse);
  };
  EXPECT_EQ(why({"--mask-mod", "causal"}), std::string(""));
  EXPECT_EQ(why({"--mask-mod", "causal", "--block-size", "256,128", "--bwd"}), std::string(""));
  EXPECT_EQ(why({"--mask-mod", "causal", "--block-size", "100"}),
            std::string("--block-size 100,100 is not a multiple of the kernel tile 128 x 128 of the block-sparse "
                        "forward at D = 64"));
  EXPECT_CONTAINS(why({"--mask-mod", "causal", "--block-size", "64,128", "--bwd"}),
                  "--block-size 64,128 is not a multiple of the kernel tile");
  EXPECT_EQ(why({"--mask-mod", "causal", "--D", "256", "--block-size", "128,64"}), std::string(""));
  EXPECT_CONTAINS(why({"--mask-mod", "causal", "--D", "96"}), "the block-sparse forward: head dims 96 not in {");
}

TEST_CASE(no_gpu_text_says_plainly_what_is_missing) {
  // No driver: CUDA's words suggest an upgrade; the line says there is no driver first.
  EXPECT_EQ(no_gpu_text("cudaGetDeviceCount", cudaErrorInsufficientDriver, 0, 12040),
            std::string("no NVIDIA driver found, so no GPU to run on (CUDA: cudaGetDeviceCount: ") +
                cudaGetErrorString(cudaErrorInsufficientDriver) + ")");
  EXPECT_CONTAINS(no_gpu_text("cudaGetDeviceCount", cudaErrorInsufficientDriver, 11080, 12040),
                  "the NVIDIA driver runs CUDA 11.8 at most, older than this build's CUDA 12.4 runtime: update the driver");
  EXPECT_EQ(no_gpu_text("cudaGetDeviceCount", cudaSuccess, 12040, 12040),
            std::string("no NVIDIA GPU found (the driver is there, CUDA 12.4) (CUDA: cudaGetDeviceCount found no device)"));
  EXPECT_CONTAINS(no_gpu_text("cudaGetDeviceCount", cudaErrorNoDevice, 12040, 12040), "no NVIDIA GPU found");
  EXPECT_CONTAINS(no_gpu_text("cudaStreamCreate", cudaErrorDevicesUnavailable, 12040, 12040),
                  "no usable NVIDIA GPU (CUDA: cudaStreamCreate: ");
}

TEST_CASE(a_ratio_below_one_is_slower) {
  EXPECT_EQ(faster_or_slower(1.125), std::string("1.12x faster"));
  EXPECT_EQ(faster_or_slower(1.0), std::string("1.00x faster"));
  EXPECT_EQ(faster_or_slower(0.46), std::string("2.17x slower"));
  EXPECT_EQ(faster_or_slower(0.0), std::string("not compared (no time)"));
}
