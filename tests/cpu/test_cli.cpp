// flash_attn_mma's option parsing and its error messages.
#include "cli.h"
#include "testing.h"

using namespace attnlab;

namespace {
ParseResult parse(std::vector<std::string> args) { return parse_args(args); }
}  // namespace

TEST_CASE(cli_defaults_and_shape_flags) {
  const ParseResult r = parse({"--B", "2", "--H", "8", "--N", "8192", "--D", "64"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.B, 2);
  EXPECT_EQ(r.options.Nq, 8192);
  EXPECT_EQ(r.options.Nk, 8192);
  EXPECT_EQ(r.options.Dv, 64);
  EXPECT_TRUE(r.options.dtype == DType::kFloat16);
  EXPECT_TRUE(!r.options.causal && !r.options.check && !r.options.torch);
  const AttnProblem p = to_problem(r.options);
  EXPECT_NEAR(p.scale, 0.125, 1e-7);
}

TEST_CASE(cli_nq_nk_dv_override) {
  const ParseResult r = parse({"--N=100", "--Nq", "17", "--Dv", "32", "--D", "128", "--dtype", "bf16", "--causal"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.Nq, 17);
  EXPECT_EQ(r.options.Nk, 100);
  EXPECT_EQ(r.options.D, 128);
  EXPECT_EQ(r.options.Dv, 32);
  EXPECT_TRUE(r.options.dtype == DType::kBFloat16);
  EXPECT_TRUE(r.options.causal);
}

TEST_CASE(cli_run_flags) {
  const ParseResult r = parse({"--iters", "5", "--warmup", "0", "--seed", "42", "--check", "--show-all", "--variant",
                               "split-q*", "--csv", "out.csv", "--torch"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.options.iters, 5);
  EXPECT_EQ(r.options.warmup, 0);
  EXPECT_EQ(r.options.seed, uint64_t(42));
  EXPECT_TRUE(r.options.seed_given && r.options.check && r.options.show_all && r.options.torch);
  EXPECT_EQ(r.options.variant_glob, std::string("split-q*"));
  EXPECT_EQ(r.options.csv, std::string("out.csv"));
}

TEST_CASE(cli_errors_name_the_problem) {
  EXPECT_CONTAINS(parse({"--D", "0"}).error, "--D must be between 1 and 1024");
  EXPECT_CONTAINS(parse({"--D", "2000"}).error, "--D must be between 1 and 1024");
  EXPECT_CONTAINS(parse({"--N", "-5"}).error, "--N must be between 1");
  EXPECT_CONTAINS(parse({"--dtype", "fp8"}).error, "--dtype must be fp16 or bf16, got 'fp8'");
  EXPECT_CONTAINS(parse({"--B", "abc"}).error, "--B expects an integer, got 'abc'");
  EXPECT_CONTAINS(parse({"--B", "3x"}).error, "--B expects an integer");
  EXPECT_CONTAINS(parse({"--H", "99999999999999999999"}).error, "--H expects an integer");
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
  const ParseResult r = parse({"--sdpa", "--reference", "torch", "--sweep", "--sweep-N", "1024,8192", "--sweep-D",
                               "64", "--sweep-causal", "1"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.options.sdpa && r.options.torch_reference && r.options.sweep);
  EXPECT_TRUE(r.options.sweep_N == std::vector<int>({1024, 8192}));
  EXPECT_TRUE(r.options.sweep_D == std::vector<int>({64}));
  EXPECT_TRUE(r.options.sweep_causal == std::vector<int>({1}));
  const Options defaults = parse({}).options;
  EXPECT_EQ(defaults.sweep_N.size(), size_t(6));
  EXPECT_EQ(defaults.sweep_D.back(), 1024);
  EXPECT_CONTAINS(parse({"--reference", "cpu"}).error, "--reference must be fp32 or torch");
  EXPECT_CONTAINS(parse({"--sweep-N", "1024,,2048"}).error, "--sweep-N expects an integer");
  EXPECT_CONTAINS(parse({"--sweep-D", "64,2048"}).error, "--sweep-D must be between 1 and 1024");
  EXPECT_CONTAINS(parse({"--sweep-causal", "2"}).error, "--sweep-causal must be between 0 and 1");
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
  EXPECT_TRUE(r.options.dynamic_mask());
  EXPECT_EQ(r.options.Hkv, 1);
  EXPECT_EQ(r.options.mask, std::string("topk"));
  EXPECT_EQ(r.options.window, 1024);
  EXPECT_EQ(r.options.block, 0);
  EXPECT_TRUE(r.options.bias);
  EXPECT_NEAR(r.options.softcap, 30.0, 1e-6);
  EXPECT_TRUE(!parse({"--N", "64"}).options.dynamic_mask());  // the dense harness by default
  EXPECT_EQ(parse({"--bias"}).options.splits, 0);            // split-KV: automatic by default
  EXPECT_EQ(parse({"--bias", "--splits", "16"}).options.splits, 16);
  EXPECT_CONTAINS(parse({"--splits", "-1"}).error, "--splits must be between 0 and 1024");
  EXPECT_TRUE(parse({"--bwd"}).options.bwd && parse({"--bwd"}).options.dynamic_mask());
  EXPECT_CONTAINS(parse({"--bwd=1"}).error, "--bwd takes no value");
  EXPECT_EQ(parse({"--bwd"}).options.bwd_chunks, 0);  // query chunks: automatic by default
  EXPECT_TRUE(parse({"--bwd-chunks", "7"}).options.bwd_chunks == 7 && parse({"--bwd-chunks", "7"}).options.bwd);
  EXPECT_CONTAINS(parse({"--bwd-chunks", "5000"}).error, "--bwd-chunks must be between 0 and 4096");
  EXPECT_TRUE(parse({"--deterministic"}).options.deterministic && parse({"--deterministic"}).options.bwd);
  EXPECT_TRUE(!parse({"--bwd"}).options.bwd_own_prepass);  // default: the forward's mask summary
  EXPECT_TRUE(parse({"--bwd-own-prepass"}).options.bwd_own_prepass && parse({"--bwd-own-prepass"}).options.bwd);
  EXPECT_CONTAINS(parse({"--bwd-own-prepass=1"}).error, "--bwd-own-prepass takes no value");
  EXPECT_TRUE(parse({"--mask", "ones", "--mask-bits"}).options.mask_bits &&
              parse({"--mask", "ones", "--mask-bits"}).options.dynamic_mask());
  EXPECT_TRUE(!parse({"--mask", "ones"}).options.mask_bits);
  EXPECT_CONTAINS(parse({"--mask-bits"}).error, "--mask-bits packs the mask: add --mask ones or --mask topk");
  EXPECT_CONTAINS(parse({"--mask", "causal", "--mask-bits"}).error, "--mask-bits packs the mask");
  EXPECT_CONTAINS(parse({"--mask", "ones", "--mask-bits=1"}).error, "--mask-bits takes no value");
  EXPECT_TRUE(!parse({"--bwd-walk-in-order"}).options.bwd_rotate && parse({"--bwd-walk-in-order"}).options.bwd);
  EXPECT_CONTAINS(parse({"--bwd-walk-in-order=1"}).error, "--bwd-walk-in-order takes no value");
  EXPECT_EQ(parse({"--bias"}).options.dma_core, std::string("auto"));
  EXPECT_TRUE(parse({"--dma-core", "mma"}).options.dma_core == "mma" && parse({"--dma-core", "mma"}).options.dynamic_mask());
  EXPECT_CONTAINS(parse({"--dma-core", "tensor"}).error, "--dma-core must be auto, mma, wgmma, wgmma-cp.async or gather");
  EXPECT_EQ(parse({"--bias"}).options.dma_mask_scan, std::string("auto"));
  EXPECT_TRUE(parse({"--dma-mask-scan", "in-kernel"}).options.dma_mask_scan == "in-kernel" &&
              parse({"--dma-mask-scan", "prepass"}).options.dynamic_mask());
  EXPECT_CONTAINS(parse({"--dma-mask-scan", "fused"}).error,
                  "--dma-mask-scan must be auto, prepass, in-kernel or pipelined, got 'fused'");
  EXPECT_TRUE(parse({"--dma-mask-scan", "pipelined"}).options.dma_mask_scan == "pipelined");
  EXPECT_EQ(parse({"--dma-prepass-chunks", "4"}).options.dma_prepass_chunks, 4);
  EXPECT_TRUE(parse({"--dma-prepass-chunks", "4"}).options.dynamic_mask());
  EXPECT_CONTAINS(parse({"--dma-prepass-chunks", "17"}).error, "--dma-prepass-chunks must be between 0 and 16");
  EXPECT_TRUE(parse({"--mask", "causal"}).options.causal);    // --mask causal implies --causal
  EXPECT_CONTAINS(parse({"--mask", "random"}).error, "--mask must be none, causal, ones or topk, got 'random'");
  EXPECT_CONTAINS(parse({"--H", "8", "--Hkv", "3"}).error, "--H must be a multiple of --Hkv");
  EXPECT_CONTAINS(parse({"--mask", "topk"}).error, "--mask topk selects keys by the bias: add --bias");
  EXPECT_CONTAINS(parse({"--softcap", "-1"}).error, "--softcap expects a number >= 0");
  EXPECT_CONTAINS(parse({"--softcap", "x"}).error, "--softcap expects a number >= 0");
  EXPECT_CONTAINS(parse({"--bias", "--sweep"}).error, "--sweep does not apply to dynamic-mask runs");
  EXPECT_CONTAINS(parse({"--bias", "--Dv", "32"}).error, "dynamic-mask attention needs Dv == D");
}
