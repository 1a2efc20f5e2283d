#include "cli_flags.h"

#include "blocksparse/mods.h"
#include "cli_values.h"

namespace attnlab {
namespace {

constexpr long kMaxBatchOrHeads = 65535;  // grid-dimension limits of the kernels
constexpr long kMaxSeqLen = 1L << 30;
constexpr long kMaxHeadDim = 1024;
constexpr double kMaxSoftcap = 1e6;
constexpr long kMaxSequences = 65535;  // of a packed batch or a decoding batch: the check runs each on its own
constexpr long kMaxNewTokens = 1024;   // paged decoding's new tokens per sequence (--Nq)

// The flags of the fixed-shape programs that variable-length attention and
// paged decoding refuse, and what each has instead. Paged decoding keeps --Nq:
// its new tokens per sequence.
constexpr Programs kNotVarlen = kEveryProgram & ~kVarlen;
constexpr Programs kFixedShape = kNotVarlen & ~kDecode;
const Elsewhere kVarlenShape{Program::kVarlen, "the sequences and their lengths come from --varlen (and --varlen-k)"};
const Elsewhere kVarlenNoPeers{Program::kVarlen,
                               "variable-length attention has no peers (its dense padded row is a yardstick)"};
const Elsewhere kVarlenNoBackward{
    Program::kVarlen, "the harness does not time the variable-length backward yet (build/test_varlen checks it)"};
const Elsewhere kDecodeShape{Program::kDecode,
                             "the sequences and their cache lengths come from --decode (--Nq: the new tokens of each)"};
const Elsewhere kDecodeNoPeers{Program::kDecode, "paged decoding has no peers (its copy row is a bandwidth yardstick)"};
const Elsewhere kDecodeNoBackward{Program::kDecode, "paged decoding has a forward only (decoding is inference)"};

// Where a row's option lives: its member of the program's part of Options.
template <typename T> T* field(Options& o, T CommonOptions::*m) { return &(o.common.*m); }
template <typename T> T* field(Options& o, T DenseOptions::*m) { return &(o.dense.*m); }
template <typename T> T* field(Options& o, T DynamicMaskOptions::*m) { return &(o.dynamic_mask.*m); }
template <typename T> T* field(Options& o, T BlocksparseOptions::*m) { return &(o.blocksparse.*m); }
template <typename T> T* field(Options& o, T VarlenOptions::*m) { return &(o.varlen.*m); }
template <typename T> T* field(Options& o, T DecodeOptions::*m) { return &(o.decode.*m); }

// The setters of the common kinds of value.
template <typename Member>
SetOption integer(long lo, long hi, Member m) {
  return [=](const std::string& flag, const std::string& v, Options& o) { return parse_int(flag, v, lo, hi, field(o, m)); };
}
// One integer for two options: --N for Nq and Nk, --D for D and Dv (whose own
// rows, later in the table, override it).
template <typename Member>
SetOption integer_for_both(long lo, long hi, Member first, Member second) {
  return [=](const std::string& flag, const std::string& v, Options& o) {
    const std::string e = parse_int(flag, v, lo, hi, field(o, first));
    *field(o, second) = *field(o, first);
    return e;
  };
}
template <typename Member>
SetOption integers(long lo, long hi, Member m) {
  return [=](const std::string& flag, const std::string& v, Options& o) {
    return parse_int_list(flag, v, lo, hi, field(o, m));
  };
}
template <typename Member>
SetOption one_of(std::vector<std::string> allowed, Member m) {
  return [=](const std::string& flag, const std::string& v, Options& o) { return parse_choice(flag, v, allowed, field(o, m)); };
}
template <typename Member>
SetOption text(const std::string& example, Member m) {
  return [=](const std::string& flag, const std::string& v, Options& o) {
    *field(o, m) = v;
    return v.empty() ? flag + " needs " + example : "";
  };
}
template <typename Member>
SetOption on(Member m) {
  return [=](const std::string&, const std::string&, Options& o) {
    *field(o, m) = true;
    return "";
  };
}

// --torch, --sdpa: the first of them drops both groups of peers, then each
// adds its own.
SetOption pick_peers(bool CommonOptions::*group) {
  return [=](const std::string&, const std::string&, Options& o) {
    CommonOptions& c = o.common;
    if (!c.peers_given) c.torch = c.sdpa = false;
    c.peers_given = true;
    c.*group = true;
    return "";
  };
}

std::vector<Flag> make_flags() {
  return {
      // ---- every program ----------------------------------------------------
      {"--H", "N", kEveryProgram, "heads (default 8)", integer(1, kMaxBatchOrHeads, &CommonOptions::H)},
      {"--Hkv", "N", kEveryProgram,
       "KV heads, H a multiple of N: GQA (MQA with 1); query head h reads KV head h / (H / N) (default: --H)",
       integer(1, kMaxBatchOrHeads, &CommonOptions::Hkv)},
      {"--D", "N", kEveryProgram, "head dim of Q and K (default 64)",
       integer_for_both(1, kMaxHeadDim, &CommonOptions::D, &CommonOptions::Dv)},
      {"--Dv", "N", kEveryProgram,
       "head dim of V and O (default: --D; dynamic-mask attention and paged decoding need Dv = D)",
       integer(1, kMaxHeadDim, &CommonOptions::Dv)},
      {"--dtype", "T", kEveryProgram, "fp16 | bf16 (default fp16)",
       [](const std::string&, const std::string& v, Options& o) {
         if (v == "fp16" || v == "float16" || v == "half") o.common.dtype = DType::kFloat16;
         else if (v == "bf16" || v == "bfloat16") o.common.dtype = DType::kBFloat16;
         else return "--dtype must be fp16 or bf16, got '" + v + "'";
         return std::string();
       }},
      {"--warmup", "N", kEveryProgram, "untimed runs per row (default 2)", integer(0, 100000, &CommonOptions::warmup)},
      {"--iters", "N", kEveryProgram, "timed runs per row; the median is reported (default 10)",
       integer(1, 100000, &CommonOptions::iters)},
      {"--seed", "N", kEveryProgram, "input seed, 0 ... 2^64-1 (default: from the clock, printed in the banner)",
       [](const std::string&, const std::string& v, Options& o) {
         o.common.seed_given = true;
         return parse_seed(v, &o.common.seed);
       }},
      {"--no-check", "", kEveryProgram,
       "time only. By default every row is checked against the program's reference, exit 1 on any FAIL",
       [](const std::string&, const std::string&, Options& o) {
         o.common.check = false;
         return "";
       }},
      {"--check", "", kEveryProgram, "the check, the default (may still be given; not with --no-check)",
       [](const std::string&, const std::string&, Options&) { return ""; }},
      {"--csv", "FILE", kEveryProgram,
       "append every row to FILE (with GPU, driver, CUDA, commit, date); FILE must be writable, checked before "
       "anything runs",
       text("a file name", &CommonOptions::csv)},
      {"--list", "", kEveryProgram,
       "list the rows and their tile configurations, no GPU needed (--variant, --torch, --sdpa, --no-peers and "
       "--bwd choose them)",
       on(&CommonOptions::list)},
      {"--help", "", kEveryProgram, "this text, whatever else is given (also -h)", on(&CommonOptions::help), false,
       "-h"},

      // ---- every program but variable-length attention and paged decoding -------
      {"--B", "N", kFixedShape, "batch size (default 1)", integer(1, kMaxBatchOrHeads, &CommonOptions::B), false, "",
       {kVarlenShape, kDecodeShape}},
      {"--N", "N", kFixedShape, "sequence length of queries and keys (default 4096)",
       integer_for_both(1, kMaxSeqLen, &CommonOptions::Nq, &CommonOptions::Nk), false, "",
       {kVarlenShape, kDecodeShape}},
      {"--Nk", "N", kFixedShape,
       "key length, where it differs from the queries' (overrides --N; --N with both --Nq and --Nk is an error)",
       integer(1, kMaxSeqLen, &CommonOptions::Nk), false, "", {kVarlenShape, kDecodeShape}},
      {"--sdpa", "", kFixedShape,
       "of the peers, torch's SDPA backends (an error in a build without PyTorch; with --torch: both groups)",
       pick_peers(&CommonOptions::sdpa), false, "", {kVarlenNoPeers, kDecodeNoPeers}},
      {"--no-peers", "", kFixedShape,
       "no peers, ours alone (the dense forward's check still runs `unfused` for its bound); an error with --torch "
       "or --sdpa",
       [](const std::string&, const std::string&, Options& o) {
         o.common.torch = o.common.sdpa = false;
         return "";
       },
       false, "", {kVarlenNoPeers, kDecodeNoPeers}},
      {"--bwd", "", kFixedShape, "the program's backward instead of its forward, on the same shape",
       on(&CommonOptions::bwd), false, "", {kVarlenNoBackward, kDecodeNoBackward}},
      {"--deterministic", "", kFixedShape,
       "the program's deterministic backward (implies --bwd), its gradients repeated and compared bit for bit: "
       "the dense backward's deterministic rungs alone (named '*+deterministic'; --variant narrows them), "
       "dmattn's deterministic mode, block-sparse attention's blocksparse-det bwd alone",
       on(&CommonOptions::deterministic), true, "", {kVarlenNoBackward, kDecodeNoBackward}},

      // ---- every program but variable-length attention ------------------------
      {"--Nq", "N", kNotVarlen,
       "query length, where it differs from the keys' (overrides --N); paged decoding: the new tokens of each "
       "sequence, 1 to 1024 (default 1)",
       [](const std::string& flag, const std::string& v, Options& o) {
         return parse_int(flag, v, 1, o.program == Program::kDecode ? kMaxNewTokens : kMaxSeqLen, &o.common.Nq);
       },
       false, "", {kVarlenShape}},

      // ---- every program but block-sparse attention ---------------------------
      {"--causal", "", kDense | kDynamicMask | kVarlen | kDecode,
       "causal mask, bottom-right aligned when Nq != Nk (variable-length attention: within each sequence; paged "
       "decoding: the default, each new token sees the cache up to its own row)",
       on(&CommonOptions::causal), false, "",
       {{Program::kBlocksparse, "block-sparse attention's causal mask is --mask-mod causal"}}},

      // ---- the dense forward and backward, and dynamic-mask attention -----------
      {"--torch", "", kDense | kDynamicMask,
       "of the peers, the unfused baselines: `unfused` and, in a torch build, `torch(unfused)` (with --sdpa: both "
       "groups)",
       pick_peers(&CommonOptions::torch), false, "",
       {{Program::kBlocksparse, "block-sparse attention's peers are torch's SDPA (--sdpa)"}, kVarlenNoPeers,
        kDecodeNoPeers}},

      // ---- the dense forward and backward -------------------------------------
      {"--variant", "GLOB", kDense,
       "run only the rungs whose name matches, e.g. 'split-q*', 'bwd-ws*'; several globs separated by commas: "
       "'ws*,wgmma+stage2*'",
       text("a glob, e.g. 'split-q*'", &DenseOptions::variant_glob)},
      {"--show-all", "", kDense,
       "show every row (default: only rows that beat the best so far, plus failures and unsupported rows)",
       on(&DenseOptions::show_all), false, "--show"},

      // ---- the dense forward ---------------------------------------------------
      {"--reference", "R", kDenseForward,
       "what the check compares against: fp32 (attnlab's fp32 GPU reference, default) | torch (torch's math SDPA "
       "on fp32 copies; needs a torch build); an error with --no-check",
       [](const std::string& flag, const std::string& v, Options& o) {
         std::string reference;
         const std::string e = parse_choice(flag, v, {"fp32", "torch"}, &reference);
         o.dense.torch_reference = reference == "torch";
         return e;
       }},
      {"--sweep", "", kDenseForward,
       "run a grid of shapes (B, H, dtype as given) and print one line per shape; rows go to --csv. The grid sets "
       "N, D (= Dv) and the causal flag, so --N, --Nq, --Nk, --D, --Dv, --causal and --show-all are errors with it",
       on(&DenseOptions::sweep)},
      {"--sweep-N", "L", kDenseForward,
       "the grid's sequence lengths, comma-separated (default 1024,2048,...,32768; needs --sweep)",
       integers(1, kMaxSeqLen, &DenseOptions::sweep_N)},
      {"--sweep-D", "L", kDenseForward, "the grid's head dims (default 32,64,128,256,512,1024; needs --sweep)",
       integers(1, kMaxHeadDim, &DenseOptions::sweep_D)},
      {"--sweep-causal", "L", kDenseForward, "the grid's causal flags, 0 and 1 (default 0,1; needs --sweep)",
       integers(0, 1, &DenseOptions::sweep_causal)},

      // ---- dynamic-mask attention ---------------------------------------------
      {"--mask", "M", kDynamicMask,
       "selects dynamic-mask attention: none | causal | ones (an all-ones mask) | topk (per query, the --window "
       "keys of largest bias, smoothed per --block keys; needs --bias)",
       [](const std::string& flag, const std::string& v, Options& o) {
         if (v == "causal") o.common.causal = true;
         return parse_choice(flag, v, {"none", "causal", "ones", "topk"}, &o.dynamic_mask.mask);
       }},
      {"--window", "W", kDynamicMask, "keys kept per query by --mask topk (default 1024; needs --mask topk)",
       integer(0, kMaxSeqLen, &DynamicMaskOptions::window)},
      {"--block", "N", kDynamicMask, "majority-vote block of --mask topk (default 64, 0 = off; needs --mask topk)",
       integer(0, 65536, &DynamicMaskOptions::block)},
      {"--bias", "", kDynamicMask, "add a random per-key bias of shape (B, Hkv, 1, Nk)",
       on(&DynamicMaskOptions::bias)},
      {"--softcap", "C", kDynamicMask, "S = C·tanh(S / C) after the bias (default 0: off)",
       [](const std::string& flag, const std::string& v, Options& o) {
         return parse_number(flag, v, 0, kMaxSoftcap, &o.dynamic_mask.softcap);
       },
       false, "", {{Program::kBlocksparse, "block-sparse attention's softcap is --score-mod softcap:C"}}},
      {"--splits", "N", kDynamicMask,
       "split-KV parts per query block, merged by LSE (default 0 = automatic: more than one only when the query "
       "blocks alone would leave SMs idle, e.g. decoding with --Nq 1)",
       integer(0, 1024, &DynamicMaskOptions::splits)},
      {"--dma-core", "C", kDynamicMask,
       "the forward's kernel: auto (default: gather for --Nq 1 with a mask, else wgmma on an sm_90 GPU for D in "
       "{64, 128}, else mma), mma, wgmma (K, V by TMA where aligned), wgmma-cp.async (K, V by cp.async), gather "
       "(decoding: the active keys' K and V rows only, not their 64-key tiles; needs --Nq 1 and --mask ones or topk)",
       one_of({"auto", "mma", "wgmma", "wgmma-cp.async", "gather"}, &DynamicMaskOptions::dma_core)},
      {"--dma-mask-scan", "S", kDynamicMask,
       "where the forward reads the mask for its skip test (needs --mask ones or topk): auto (default: in-kernel "
       "when at most two blocks share a mask byte and a block scans at most 16K keys, else pipelined where it can "
       "be, else prepass), prepass (a kernel summarises the mask into tile bits first), in-kernel (each block reads "
       "its rows), pipelined (the pre-pass in chunks of query tiles, each chunk's forward on a side stream as soon "
       "as its bits exist)",
       one_of({"auto", "prepass", "in-kernel", "pipelined"}, &DynamicMaskOptions::dma_mask_scan)},
      {"--dma-prepass-chunks", "N", kDynamicMask,
       "the pipelined pre-pass's chunks (0: automatic, 4; at most 16; needs --mask ones or topk, and "
       "--dma-mask-scan auto or pipelined)",
       integer(0, 16, &DynamicMaskOptions::dma_prepass_chunks)},
      {"--mask-bits", "", kDynamicMask,
       "also run dmattn on the same mask bit-packed (one bit per query and key, DmaMaskFormat::kBits; packed once "
       "by dma_pack_mask_bits, outside the timed calls): rows 'dmattn (bit-packed mask)' and, with --bwd, 'dmattn "
       "bwd (bit-packed mask)'; needs --mask ones or topk",
       on(&DynamicMaskOptions::mask_bits)},
      {"--bwd-chunks", "N", kDynamicMask,
       "the backward's query chunks: blocks sharing one 64-key tile's walk over the query tiles, adding dK, dV "
       "through fp32 atomics (implies --bwd; default 0 = automatic, 1 = one block per key tile; not with "
       "--deterministic, which always uses 1)",
       integer(0, 4096, &DynamicMaskOptions::bwd_chunks), true},
      {"--bwd-walk-in-order", "", kDynamicMask,
       "the backward's key tiles all walk their query tiles from the first (default: key tile j from query tile j, "
       "wrapping); for A/B runs; implies --bwd",
       [](const std::string&, const std::string&, Options& o) {
         o.dynamic_mask.bwd_rotate = false;
         return "";
       },
       true},
      {"--bwd-own-prepass", "", kDynamicMask,
       "the backward runs its own mask pre-pass (default: it reads the tile bits the forward's pre-pass or "
       "in-kernel scan stored, as in training); the time of a backward called alone; implies --bwd; needs --mask "
       "ones or topk",
       on(&DynamicMaskOptions::bwd_own_prepass), true},

      // ---- block-sparse attention ---------------------------------------------
      {"--mask-mod", "M", kBlocksparse,
       "selects block-sparse attention: the mask_mod, NAME[:ARGS]: " + mask_mod_names(false) +
           " (causal and sliding_window bottom-right aligned; document[:K]: K documents of random lengths summing "
           "to max(Nq, Nk), the same ids for queries and keys, one set per batch, from --seed; default K = 4, at "
           "most the length)",
       text("a spec, e.g. causal", &BlocksparseOptions::mask_mod)},
      {"--score-mod", "S", kBlocksparse,
       "the score_mod on the scaled score: " + score_mod_names(false) + " (default none)",
       text("a spec, e.g. alibi", &BlocksparseOptions::score_mod)},
      {"--block-size", "Q,KV", kBlocksparse,
       "the block mask's blocks (default 128,128; one number: both), multiples of the kernel's tile (128 x 128; "
       "128 x 64 at D=256)",
       [](const std::string& flag, const std::string& v, Options& o) {
         std::vector<int> sizes;
         if (std::string e = parse_int_list(flag, v, 1, 1 << 20, &sizes); !e.empty()) return e;
         if (sizes.size() > 2) return "--block-size takes Q,KV or one size for both, got '" + v + "'";
         o.blocksparse.block_q = sizes.front();
         o.blocksparse.block_kv = sizes.back();
         return std::string();
       }},

      // ---- variable-length attention ------------------------------------------
      {"--varlen", "LENGTHS", kVarlen,
       "selects variable-length attention: a packed batch of sequences of these lengths, queries and keys alike: "
       "comma-separated, each 0 or more (8192,1,517,3000), or random:B,MEAN, B lengths drawn from --seed "
       "uniformly in [1, 2·MEAN - 1] (mean MEAN); at most 2^31 - 1 rows in all",
       [](const std::string& flag, const std::string& v, Options& o) {
         return parse_varlen_lengths(flag, v, kMaxSeqLen, kMaxSequences, &o.varlen.q);
       }},
      {"--varlen-k", "LENGTHS", kVarlen,
       "the key lengths, where they differ from the queries': one per sequence of --varlen, in the same forms "
       "(random: draws its own lengths from --seed)",
       [](const std::string& flag, const std::string& v, Options& o) {
         return parse_varlen_lengths(flag, v, kMaxSeqLen, kMaxSequences, &o.varlen.k);
       }},

      // ---- variable-length attention and paged decoding -------------------------
      {"--unverified", "", kVarlen | kDecode,
       "run the program's kernel although it has not run on a GPU yet (without this the program stops, exit 2); "
       "its row is named 'varlen (unverified)' or 'decode (unverified)'",
       [](const std::string&, const std::string&, Options& o) {
         (o.program == Program::kDecode ? o.decode.unverified : o.varlen.unverified) = true;
         return "";
       }},

      // ---- paged decoding -------------------------------------------------------
      {"--decode", "LENGTHS", kDecode,
       "selects paged decoding: one sequence per length, the keys its KV cache holds (the new tokens' among "
       "them): comma-separated, each 0 or more (4096,1,0,517), or random:B,MEAN, B lengths drawn from --seed "
       "uniformly in [1, 2·MEAN - 1]; at most 65535 sequences",
       [](const std::string& flag, const std::string& v, Options& o) {
         return parse_cache_lengths(flag, v, kMaxSeqLen, kMaxSequences, &o.decode.lengths);
       }},
      {"--page-size", "P", kDecode, "rows of the cache per page, 1 or more (default 64)",
       integer(1, kMaxSeqLen, &DecodeOptions::page_size)},
      {"--no-causal", "", kDecode,
       "every new token sees its whole cache (default: causal, as decoding is); an error with --causal",
       [](const std::string&, const std::string&, Options& o) {
         o.common.causal = false;
         return "";
       }},
  };
}

}  // namespace

const std::vector<Flag>& flag_table() {
  static const std::vector<Flag> flags = make_flags();
  return flags;
}

const std::vector<ProgramInfo>& program_table() {
  static const std::vector<ProgramInfo> programs = {
      {Program::kDenseForward, "the dense forward", "",
       "Rows: the peers first, by default every one this build has: the unfused baselines `unfused` (cuBLAS + "
       "softmax + cuBLAS) and, in a torch build, `torch(unfused)` and torch's SDPA backends sdpa(flash) (FA2), "
       "sdpa(cudnn), sdpa(efficient) (--torch and --sdpa pick groups, only those given run); then every rung of "
       "the ladder (--variant picks them). Each is checked against the reference: err <= 2 x the unfused "
       "baseline's err + 2 x rounding."},
      {Program::kDenseBackward, "the dense backward", "--bwd",
       "Every backward rung (--variant picks them; --list --bwd lists them) and the peers sdpa(flash), "
       "sdpa(cudnn), sdpa(efficient) (no mask; causal by torch's flag, so unsupported when Nq != Nk) and "
       "torch(unfused): torch's autograd, each from its own forward graph, the backward alone timed. Rows '<name> "
       "bwd'. The backward starts from the fp32 reference's O (rounded to the dtype) and LSE and a random dO; each "
       "of dQ, dK, dV is checked against the fp32 reference backward by the forward's rule: err <= 2 x the "
       "same-precision unfused backward's err (S, P, dP, dS in the dtype) + 2 x rounding; a deterministic rung is "
       "also run 5 more times and must repeat bit for bit. TFLOPS count 2·(3D+2Dv)·pairs."},
      {Program::kDynamicMask, "dynamic-mask attention", "--mask M",
       "flash-dmattn semantics (kernels/dmattn/). Rows: dmattn (ours; effective TFLOPS count unmasked pairs only; "
       "the share of 64x64 tiles skipped), the dense split-q+stage2 rung on the same shape, and the peers: torch "
       "given the same mask and bias as an additive float mask, sdpa(efficient), sdpa(cudnn), torch(unfused), and "
       "sdpa(default), torch's own entry point (its note says which backend torch picks there), beside "
       "sdpa(cudnn) without them, the dense speed of light; with no mask and no bias, the torch rows are plain "
       "SDPA (sdpa(flash) too), without a mask, causal by torch's flag (unsupported when Nq != Nk). Each note says "
       "whether torch had the mask ('masked' or 'no mask'). The rows are checked unless --no-check (against "
       "dmattn's fp32 reference, where it takes Nk; a row past that says so) and the peers run unless --no-peers "
       "(by default in a torch build; --torch or --sdpa ask for them, and --sdpa adds FA2's backward where every "
       "pair is active). --bwd: also the backward, dmattn's (dQ, dK, dV, dBias) and, with the peers, torch's "
       "through autograd; TFLOPS count 2·(3D+2Dv)·pairs."},
      {Program::kBlocksparse, "block-sparse attention", "--mask-mod M",
       "FlexAttention's model (kernels/blocksparse/, docs/blocksparse.md). Rows: blocksparse (ours: the block mask "
       "built on the GPU from the mask_mod, then the block-sparse forward) and, in a torch build where the "
       "mask_mod is causal or none with no score_mod, the peers sdpa(cudnn) and sdpa(flash) (torch's is_causal: "
       "unsupported when causal and Nq != Nk). torch's compiled flex_attention runs from Python: "
       "scripts/bench_blocksparse.py. Checked (unless --no-check) against the fp32 mask_mod/score_mod reference by "
       "the dense rule, the yardstick its same-precision path (P rounded to the dtype); TFLOPS count "
       "2·(D+Dv)·pairs, pairs = the (query, key) pairs the mask_mod keeps, counted exactly on the GPU. --csv rows: "
       "the columns of bench.csv and `mask`, `score` after them (a file of other columns is refused). --bwd: the "
       "backward instead (rows \"sdpa(cudnn) bwd\", \"sdpa(flash) bwd\" as above, \"blocksparse bwd\" and its "
       "deterministic mode \"blocksparse-det bwd\"), from O and LSE of the fp32 mods reference, each of dQ, dK, dV "
       "checked against the fp32 mods reference backward by the dense backward's rule; TFLOPS count "
       "2·(3D+2Dv)·pairs."},
      {Program::kVarlen, "variable-length attention", "--varlen LENGTHS",
       "FlashAttention's varlen forward (kernels/varlen/): Q, K, V, O packed [total rows, heads, D], each sequence "
       "its own problem (causal: bottom-right within it), sequences of length 0 allowed. Its kernel has not run on "
       "a GPU yet: the program stops (exit 2) unless --unverified is given. Rows: varlen (unverified) (ours: rung "
       "12's engine over the packed batch, so named until its kernel has run on a GPU) and, as a yardstick, dense "
       "padded (engine): "
       "rung 12's ws+stage2+pingpong on the batch padded to B x the longest length, timed only (where every "
       "sequence has as many keys as queries), its TFLOPS counted on the packed batch's pairs, so that the two "
       "times say what packing saves. Checked (unless --no-check) sequence by sequence against the fp32 reference "
       "by the dense rule (the yardstick: the unfused baseline on that sequence), the row's verdict the worst "
       "sequence's; TFLOPS count 2·(D+Dv)·pairs, pairs = the unmasked pairs of every sequence. --csv rows: the "
       "columns of bench.csv (B the sequences; Nq, Nk the longest) and lengths, lengths_k, total_q, total_k and "
       "unverified (1: the kernel had not run on a GPU before) after them (a file of other columns is refused). No "
       "backward yet."},
      {Program::kDecode, "paged decoding", "--decode LENGTHS",
       "Decoding against a paged KV cache, as FlashAttention's flash_attn_with_kvcache with a block table "
       "(kernels/varlen/paged_decode.h): --Nq new tokens per sequence (default 1), the last --Nq keys of its cache; "
       "causal by default (bottom-right: each token sees the cache up to its own row; --no-causal: all of it); "
       "caches of 0 keys or more, in pages of --page-size rows, placed in a random order (from --seed) in one cache "
       "with a few pages no sequence reads. Its kernel has not run on a GPU yet: the program stops (exit 2) unless "
       "--unverified is given. Rows: decode (unverified) (ours: flash-decoding through the block table, so named "
       "until its kernel has run on a GPU) and, as a yardstick, copy (bandwidth): a device-to-device cudaMemcpy of "
       "1 GiB, timed in the same rounds. Checked (unless --no-check) sequence by sequence against the fp32 reference "
       "on its K and V gathered through the table, by the dense rule (the yardstick: the unfused baseline on that "
       "sequence), the row's verdict the worst sequence's; a sequence without keys must give O = 0 and LSE = -inf. "
       "TFLOPS count 2·(D+Dv)·pairs, pairs = the unmasked pairs of every sequence; GB/s count the bytes of K and V "
       "of every cache (L·Hkv·(D+Dv)·2) and of Q and O (the copy: its bytes read and written), each row's also as a "
       "fraction of the copy's. --csv rows: the columns of bench.csv (B the sequences, Nq the new tokens, Nk the "
       "longest cache) and lengths, page_size, bytes, gbps, copy_fraction and unverified after them (a file of "
       "other columns is refused). No backward."},
  };
  return programs;
}

const ProgramInfo& program_info(Program p) {
  for (const ProgramInfo& info : program_table())
    if (info.program == p) return info;
  return program_table().front();
}

}  // namespace attnlab
