#include "cli.h"

#include <algorithm>
#include <set>

#include "blocksparse/mods.h"
#include "cli_values.h"

namespace attnlab {
namespace {

constexpr long kMaxBatchOrHeads = 65535;   // grid-dimension limits of the kernels
constexpr long kMaxSeqLen = 1L << 30;
constexpr long kMaxHeadDim = 1024;
constexpr double kMaxSoftcap = 1e6;

// "document:K" -> "document" and K in *count (when given); any other spec as it is.
std::string split_document_count(const std::string& spec, int L, int* count, std::string* error) {
  if (spec.rfind("document:", 0) != 0) return spec;
  const std::string k = spec.substr(9);
  if (!parse_int("--mask-mod document:K", k, 1, L, count).empty())
    *error = "--mask-mod document:K takes K documents, 1 to the sequence length " + std::to_string(L) + ", got '" +
             k + "'";
  return "document";
}

// One option of the help: "  FLAG" padded to 20 columns, then `text`
// wrapped at 80 under it.
std::string help_item(const std::string& flag, const std::string& text) {
  const size_t indent = 20, width = 80;
  std::string out = "  " + flag, word;
  size_t column = out.size();
  bool first = true;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ' ') {
      word += text[i];
      continue;
    }
    if (word.empty()) continue;
    if (first) {
      out += std::string(indent - column, ' '), column = indent;
    } else if (column + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' '), column = indent;
    } else {
      out += ' ', ++column;
    }
    out += word, column += word.size(), first = false;
    word.clear();
  }
  return out + "\n";
}

}  // namespace

std::string usage() {
  return R"(flash_attn_mma — time and check every attention variant on one shape

usage: flash_attn_mma [options]      (--flag V or --flag=V; each option once)
  --B 1 --H 8 --N 8192 --D 128     every rung and peer of this build, each row checked
    --causal --dtype bf16 --Hkv 2  a causal mask, bf16, 8 query heads over 2 KV heads
    --variant 'ws*' --no-peers --no-check   the rungs that match, alone, timed only
  --bwd                            the backward rungs and torch's backward instead
  --mask topk --window 1024 --bias dynamic-mask attention (flash-dmattn's), below
  --mask-mod sliding_window:512,0  block-sparse attention (FlexAttention's mods), below
  --list                           every variant and its tiles (no GPU needed)
exit status: 0 ok, 1 a check or the run failed, 2 bad options, 3 no usable GPU

the dense forward (and, with --bwd, backward):
  --B N             batch size (default 1)
  --H N             heads (default 8)
  --Hkv N           KV heads, H a multiple of N: GQA (MQA with 1); query head h
                    reads KV head h / (H / N) (default: --H; both modes)
  --N N             sequence length of queries and keys (default 4096)
  --Nq N, --Nk N    query / key lengths when they differ (override --N; --N
                    with both of them is an error)
  --D N             head dim of Q and K (default 64)
  --Dv N            head dim of V and O (default: --D)
  --dtype T         fp16 | bf16 (default fp16)
  --causal          causal mask, bottom-right aligned when Nq != Nk
  --warmup N        untimed runs per variant (default 2)
  --iters N         timed runs per variant, in rounds over all the rows; the median
                    is reported (default 10)
  --seed N          input seed, 0 ... 2^64-1 (default: from the clock, printed
                    in the banner)
  --no-check        time only. By default every row is checked against the
                    reference, exit 1 on any FAIL (--check, the default, may
                    still be given; not with --no-check)
  --reference R     what the check compares against: fp32 (attnlab's fp32 GPU
                    reference, default) | torch (torch's math SDPA on fp32
                    copies; needs a torch build); an error with --no-check
  --show-all        show every row (default: only rows that beat the best so far,
                    plus failures and unsupported rows)
  --variant GLOB    run only variants whose name matches, e.g. 'split-q*';
                    several globs separated by commas: 'ws*,wgmma+stage2*'
  The peers come first: by default every one this build has, the unfused
  baselines `unfused` (cuBLAS + softmax + cuBLAS) and, in a torch build,
  `torch(unfused)` and torch's SDPA backends sdpa(flash) (FA2), sdpa(cudnn),
  sdpa(efficient). --torch and --sdpa pick groups (only those given run):
  --torch           the unfused baselines
  --sdpa            the SDPA backends (an error in a build without PyTorch)
  --no-peers        no peers, the rungs alone (the check still runs `unfused`
                    for its bound); an error with --torch or --sdpa
  --sweep           run a grid of shapes (B, H, dtype as given) and print one line
                    per shape; rows go to --csv. The grid sets N, D (= Dv) and the
                    causal flag, so --N, --Nq, --Nk, --D, --Dv, --causal and
                    --show-all are errors with it. Grid: --sweep-N 1024,...,32768
                    --sweep-D 32,64,128,256,512,1024 --sweep-causal 0,1
  --sweep-N L, --sweep-D L, --sweep-causal L   the grid, comma-separated (need --sweep)
  --csv FILE        append every row to FILE (with GPU, driver, CUDA, commit, date);
                    FILE must be writable, checked before anything runs
  --bwd             the backward instead, on the same shape (--Hkv, --Nq, --Nk,
                    --D, --Dv, --dtype, --causal): every backward rung (--variant
                    picks them, e.g. 'bwd-ws*'; --list --bwd lists them) and the
                    peers sdpa(flash), sdpa(cudnn), sdpa(efficient) (no mask;
                    causal by torch's flag, so unsupported when Nq != Nk) and
                    torch(unfused): torch's autograd, each from its own forward
                    graph, the backward alone timed. Rows '<name> bwd'. The
                    backward starts from the fp32 reference's O (rounded to the
                    dtype) and LSE and a random dO; each of dQ, dK, dV is checked
                    against the fp32 reference backward by the forward's rule:
                    err <= 2 x the same-precision unfused backward's err (S, P,
                    dP, dS in the dtype) + 2 x rounding; a deterministic rung is
                    also run 5 more times and must repeat bit for bit. TFLOPS
                    count 2·(3D+2Dv)·pairs.
                    With --mask, that mode's backward (below).
                    Not with --sweep or --reference torch
  --deterministic   the deterministic backward of the mode that runs (implies
                    --bwd), its gradients repeated and compared bit for bit:
                    here the deterministic backward rungs alone (named
                    '*+deterministic'; --variant narrows them); with --mask
                    dmattn's deterministic mode; with --mask-mod
                    blocksparse-det bwd alone

dynamic-mask attention (flash-dmattn semantics). --mask selects it (--mask none
too), and the other options of this section but --bwd need it; --variant,
--show-all, --reference, --sweep and --Dv != --D are then errors:
  --mask M          none | causal | ones (an all-ones mask) | topk (per query,
                    the --window keys of largest bias, smoothed per --block keys)
  --window W        keys kept per query by --mask topk (default 1024; needs
                    --mask topk)
  --block N         majority-vote block of --mask topk (default 64, 0 = off;
                    needs --mask topk)
  --bias            add a random per-key bias of shape (B, Hkv, 1, Nk)
  --softcap C       S = C·tanh(S / C) after the bias (default 0: off)
  --bwd             with --mask: also the backward, dmattn's
                    (dQ, dK, dV, dBias) and, with the peers, torch's through
                    autograd; TFLOPS count 2·(3D+2Dv)·pairs
  --bwd-walk-in-order  the backward's key tiles all walk their query tiles
                    from the first (default: key tile j from query tile j,
                    wrapping); for A/B runs; implies --bwd
  --bwd-own-prepass  the backward runs its own mask pre-pass (default: it
                    reads the tile bits the forward's pre-pass or in-kernel
                    scan stored, as in training); the time of a backward
                    called alone; implies --bwd; needs --mask ones or topk
  --mask-bits       also run dmattn on the same mask bit-packed (one bit per
                    query and key, DmaMaskFormat::kBits; packed once by
                    dma_pack_mask_bits, outside the timed calls): rows
                    'dmattn (bit-packed mask)' and, with --bwd, 'dmattn bwd
                    (bit-packed mask)'; needs --mask ones or topk
  --bwd-chunks N    the backward's query chunks: blocks sharing one 64-key
                    tile's walk over the query tiles, adding dK, dV through
                    fp32 atomics (implies --bwd; default 0 = automatic, 1 = one
                    block per key tile; not with --deterministic, which always
                    uses 1)
  --splits N        split-KV parts per query block, merged by LSE (default 0 =
                    automatic: more than one only when the query blocks alone
                    would leave SMs idle, e.g. decoding with --Nq 1)
  --dma-core C      the forward's kernel: auto (default: gather for --Nq 1
                    with a mask, else wgmma on an sm_90 GPU for D in {64, 128},
                    else mma), mma, wgmma (K, V by TMA where aligned),
                    wgmma-cp.async (K, V by cp.async), gather (decoding: the
                    active keys' K and V rows only, not their 64-key tiles;
                    needs --Nq 1 and --mask ones or topk)
  --dma-mask-scan S where the forward reads the mask for its skip test (needs
                    --mask ones or topk): auto (default: in-kernel when at most
                    two blocks share a mask byte and a block scans at most 16K
                    keys, else pipelined where it can be, else prepass), prepass
                    (a kernel summarises the mask into tile bits first),
                    in-kernel (each block reads its rows), pipelined (the
                    pre-pass in chunks of query tiles, each chunk's forward on a
                    side stream as soon as its bits exist)
  --dma-prepass-chunks N  the pipelined pre-pass's chunks (0: automatic, 4; at
                    most 16; needs --mask ones or topk, and --dma-mask-scan
                    auto or pipelined)
  Rows: dmattn (ours; effective TFLOPS count unmasked pairs only; the share of
  64x64 tiles skipped), the dense split-q+stage2 rung on the same shape, and
  the peers: torch given the same mask and bias as an additive float mask,
  sdpa(efficient), sdpa(cudnn), torch(unfused), and sdpa(default), torch's
  own entry point (its note says which backend torch picks there), beside
  sdpa(cudnn) without them, the dense speed of light; with no mask and no
  bias, the torch rows are plain SDPA (sdpa(flash) too), without a mask, causal
  by torch's flag (unsupported when Nq != Nk). Each note says whether torch
  had the mask ('masked' or 'no mask'). As in the
  dense mode, the rows are checked unless --no-check (against dmattn's fp32
  reference, where it takes Nk; a row past that says so) and the peers run
  unless --no-peers (by default in a torch build; --torch or --sdpa ask for
  them, and --sdpa adds FA2's backward where every pair is active).

block-sparse attention (FlexAttention's model: kernels/blocksparse/,
docs/blocksparse.md). --mask-mod selects it; --causal, --sweep, --variant,
--reference, --torch, --show-all, --mask and its options are then errors:
)" + help_item("--mask-mod M",  // the lists: kernels/blocksparse/mods_table.h's rows
               "the mask_mod, NAME[:ARGS]: " + mask_mod_names(false) +
                   " (causal and sliding_window bottom-right aligned; document[:K]: K documents of random lengths "
                   "summing to max(Nq, Nk), the same ids for queries and keys, one set per batch, from --seed; "
                   "default K = 4, at most the length)") +
         help_item("--score-mod S", "the score_mod on the scaled score: " + score_mod_names(false) + " (default none)") +
         R"(  --block-size Q,KV the block mask's blocks (default 128,128; one number: both),
                    multiples of the kernel's tile (128 x 128; 128 x 64 at D=256)
  Rows: blocksparse (ours: the block mask built on the GPU from the mask_mod,
  then the block-sparse forward) and, in a torch build where the mask_mod is
  causal or none with no score_mod, the peers sdpa(cudnn) and sdpa(flash)
  (torch's is_causal: unsupported when causal and Nq != Nk). torch's compiled
  flex_attention runs from Python: scripts/bench_blocksparse.py. Checked
  (unless --no-check) against the fp32 mask_mod/score_mod reference by the rule
  above, the yardstick its same-precision path (P rounded to the dtype);
  TFLOPS count 2·(D+Dv)·pairs, pairs = the (query, key) pairs the mask_mod
  keeps, counted exactly on the GPU. --csv rows: the columns of bench.csv and
  `mask`, `score` after them (a file of other columns is refused).
  --bwd with --mask-mod: the backward instead (rows "sdpa(cudnn) bwd",
  "sdpa(flash) bwd" as above, "blocksparse bwd" and its deterministic mode
  "blocksparse-det bwd", alone with --deterministic), from O and LSE of the fp32 mods reference, each of
  dQ, dK, dV checked against the fp32 mods reference backward by the dense
  backward's rule; TFLOPS count 2·(3D+2Dv)·pairs.

  --list            list the variants and their tile configurations (--variant,
                    --torch, --sdpa and --no-peers choose the rows; with --bwd the
                    backward's; no GPU needed)
  --help            this text, whatever else is given

exit status: 0 every row ran (and, unless --no-check, passed); 1 a check failed, or
the run failed (a GPU error, a row that could not be written to --csv); 2 bad
options (nothing ran); 3 no usable CUDA GPU (nothing ran; the message says what
is missing, the NVIDIA driver or a GPU, then CUDA's own words)
)";
}

ParseResult parse_args(const std::vector<std::string>& args) {
  ParseResult r;
  Options& o = r.options;
  CommonOptions& c = o.common;
  DenseOptions& d = o.dense;
  DynamicMaskOptions& m = o.dynamic_mask;
  BlocksparseOptions& s = o.blocksparse;
  // --help (or -h) anywhere: the help, whatever else is given.
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      c.help = true;
      return r;
    }
  int n = -1, nq = -1, nk = -1, dv = -1;
  std::set<std::string> given;  // every option seen, by its canonical name
  // The options of the dynamic-mask mode, which --mask selects: the others need it.
  static const std::set<std::string> dynamic_mask_options = {
      "--mask", "--window", "--block", "--bias", "--softcap", "--bwd-walk-in-order",
      "--bwd-own-prepass", "--mask-bits", "--bwd-chunks", "--splits", "--dma-core", "--dma-mask-scan",
      "--dma-prepass-chunks"};
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool has_inline_value = false;
    if (flag.rfind("--", 0) == 0) {
      const size_t eq = flag.find('=');
      if (eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        has_inline_value = true;
      }
    }
    if (flag == "--show") flag = "--show-all";
    if (flag == "-h") flag = "--help";
    auto take_value = [&]() -> bool {
      if (has_inline_value) return true;
      if (i + 1 >= args.size()) {
        r.error = flag + " needs a value";
        return false;
      }
      value = args[++i];
      return true;
    };
    auto int_flag = [&](long lo, long hi, int* out) {
      if (take_value()) r.error = parse_int(flag, value, lo, hi, out);
    };
    auto bool_flag = [&](bool* out) {
      if (has_inline_value) r.error = flag + " takes no value";
      else *out = true;
    };
    auto choice = [&](std::initializer_list<const char*> allowed, const std::string& list, std::string* out) {
      if (!take_value()) return;
      for (const char* a : allowed)
        if (value == a) {
          *out = value;
          return;
        }
      r.error = flag + " must be " + list + ", got '" + value + "'";
    };

    if (given.count(flag)) {
      r.error = flag + " given twice";
      return r;
    }
    if (flag == "--B") int_flag(1, kMaxBatchOrHeads, &c.B);
    else if (flag == "--H") int_flag(1, kMaxBatchOrHeads, &c.H);
    else if (flag == "--N") int_flag(1, kMaxSeqLen, &n);
    else if (flag == "--Nq") int_flag(1, kMaxSeqLen, &nq);
    else if (flag == "--Nk") int_flag(1, kMaxSeqLen, &nk);
    else if (flag == "--D") int_flag(1, kMaxHeadDim, &c.D);
    else if (flag == "--Dv") int_flag(1, kMaxHeadDim, &dv);
    else if (flag == "--warmup") int_flag(0, 100000, &c.warmup);
    else if (flag == "--iters") int_flag(1, 100000, &c.iters);
    else if (flag == "--seed") {
      if (take_value()) r.error = parse_seed(value, &c.seed);
      c.seed_given = true;
    } else if (flag == "--dtype") {
      if (take_value()) {
        if (value == "fp16" || value == "float16" || value == "half") c.dtype = DType::kFloat16;
        else if (value == "bf16" || value == "bfloat16") c.dtype = DType::kBFloat16;
        else r.error = "--dtype must be fp16 or bf16, got '" + value + "'";
      }
    } else if (flag == "--variant") {
      if (take_value()) d.variant_glob = value;
    } else if (flag == "--csv") {
      if (take_value()) {
        if (value.empty()) r.error = "--csv needs a file name";
        c.csv = value;
      }
    } else if (flag == "--causal") bool_flag(&c.causal);
    else if (flag == "--check" || flag == "--no-check" || flag == "--torch" || flag == "--sdpa" ||
             flag == "--no-peers") {
      if (has_inline_value) r.error = flag + " takes no value";  // resolved below, from the options given
    }
    else if (flag == "--show-all") bool_flag(&d.show_all);
    else if (flag == "--sweep") bool_flag(&d.sweep);
    else if (flag == "--sweep-N") { if (take_value()) r.error = parse_int_list(flag, value, 1, kMaxSeqLen, &d.sweep_N); }
    else if (flag == "--sweep-D") { if (take_value()) r.error = parse_int_list(flag, value, 1, kMaxHeadDim, &d.sweep_D); }
    else if (flag == "--sweep-causal") { if (take_value()) r.error = parse_int_list(flag, value, 0, 1, &d.sweep_causal); }
    else if (flag == "--reference") {
      std::string ref;
      choice({"fp32", "torch"}, "fp32 or torch", &ref);
      d.torch_reference = ref == "torch";
    }
    else if (flag == "--Hkv") int_flag(1, kMaxBatchOrHeads, &c.Hkv);
    else if (flag == "--mask") choice({"none", "causal", "topk", "ones"}, "none, causal, ones or topk", &m.mask);
    else if (flag == "--window") int_flag(0, kMaxSeqLen, &m.window);
    else if (flag == "--block") int_flag(0, 65536, &m.block);
    else if (flag == "--bias") bool_flag(&m.bias);
    else if (flag == "--splits") int_flag(0, 1024, &m.splits);
    else if (flag == "--dma-core")
      choice({"auto", "mma", "wgmma", "wgmma-cp.async", "gather"}, "auto, mma, wgmma, wgmma-cp.async or gather",
             &m.dma_core);
    else if (flag == "--dma-mask-scan")
      choice({"auto", "prepass", "in-kernel", "pipelined"}, "auto, prepass, in-kernel or pipelined", &m.dma_mask_scan);
    else if (flag == "--dma-prepass-chunks") int_flag(0, 16, &m.dma_prepass_chunks);
    else if (flag == "--bwd") bool_flag(&c.bwd);
    else if (flag == "--deterministic") bool_flag(&c.deterministic);
    else if (flag == "--bwd-chunks") int_flag(0, 4096, &m.bwd_chunks);
    else if (flag == "--bwd-walk-in-order") {
      bool in_order = false;
      bool_flag(&in_order);
      m.bwd_rotate = !in_order;
    }
    else if (flag == "--bwd-own-prepass") bool_flag(&m.bwd_own_prepass);
    else if (flag == "--mask-bits") bool_flag(&m.mask_bits);
    else if (flag == "--softcap") { if (take_value()) r.error = parse_number(flag, value, 0, kMaxSoftcap, &m.softcap); }
    else if (flag == "--mask-mod" || flag == "--score-mod") {
      if (take_value()) {
        if (value.empty()) r.error = flag + " needs a spec, e.g. causal";
        (flag == "--mask-mod" ? s.mask_mod : s.score_mod) = value;
      }
    } else if (flag == "--block-size") {
      std::vector<int> sizes;
      if (take_value()) r.error = parse_int_list(flag, value, 1, 1 << 20, &sizes);
      if (r.error.empty() && sizes.size() > 2) r.error = "--block-size takes Q,KV or one size for both, got '" + value + "'";
      if (r.error.empty()) s.block_q = sizes.front(), s.block_kv = sizes.back();
    }
    else if (flag == "--list") bool_flag(&c.list);
    else if (flag == "--help") bool_flag(&c.help);
    else r.error = "unknown option '" + args[i] + "' (see --help)";
    if (!r.error.empty()) return r;
    given.insert(flag);
  }
  auto has = [&](const char* flag) { return given.count(flag) > 0; };
  auto fail = [&](const std::string& e) {
    r.error = e;
    return r;
  };

  if (c.deterministic || m.bwd_chunks > 0 || has("--bwd-chunks") || has("--bwd-walk-in-order") ||
      m.bwd_own_prepass)
    c.bwd = true;  // options of the backward imply it
  const bool blocksparse = !s.mask_mod.empty();
  o.program = blocksparse           ? Program::kBlocksparse
              : has("--mask")       ? Program::kDynamicMask
              : c.bwd               ? Program::kDenseBackward
                                    : Program::kDenseForward;
  if (has("--N") && has("--Nq") && has("--Nk")) return fail("--N has no effect with both --Nq and --Nk");
  if (n > 0) c.Nq = c.Nk = n;
  if (nq > 0) c.Nq = nq;
  if (nk > 0) c.Nk = nk;
  c.Dv = dv > 0 ? dv : c.D;
  if (m.mask == "causal") c.causal = true;

  // Options that mean nothing without another one.
  for (const char* f : {"--sweep-N", "--sweep-D", "--sweep-causal"})
    if (has(f) && !d.sweep) return fail(std::string(f) + " needs --sweep");
  if (d.sweep)
    for (const char* f : {"--N", "--Nq", "--Nk", "--D", "--Dv", "--causal"})
      if (has(f))
        return fail(std::string(f) +
                    " does not apply to --sweep: the grid sets it (--sweep-N, --sweep-D, --sweep-causal)");
  if (d.sweep && d.show_all) return fail("--show-all does not apply to --sweep: it prints one line per shape");

  // Checks and peers: on by default; --no-check and --no-peers turn them off,
  // and contradict the options that ask for them.
  if (has("--check") && has("--no-check")) return fail("--check and --no-check contradict each other");
  c.check = !has("--no-check");
  if (has("--reference") && !c.check)
    return fail("--reference does not apply with --no-check (it is what the check compares against)");
  for (const char* f : {"--torch", "--sdpa"})
    if (has(f) && has("--no-peers")) return fail(std::string(f) + " and --no-peers contradict each other");
  c.peers_given = has("--torch") || has("--sdpa");
  c.torch = c.peers_given ? has("--torch") : !has("--no-peers");
  c.sdpa = c.peers_given ? has("--sdpa") : !has("--no-peers");

  for (const char* f : {"--window", "--block"})
    if (has(f) && m.mask != "topk") return fail(std::string(f) + " needs --mask topk");
  const bool mask_tensor = m.mask == "topk" || m.mask == "ones";
  if (m.mask_bits && !mask_tensor) return fail("--mask-bits packs the mask: add --mask ones or --mask topk");
  for (const char* f : {"--dma-mask-scan", "--dma-prepass-chunks", "--bwd-own-prepass"})
    if (has(f) && !mask_tensor) return fail(std::string(f) + " reads the mask: add --mask ones or --mask topk");
  if (has("--dma-prepass-chunks") && m.dma_mask_scan != "auto" && m.dma_mask_scan != "pipelined")
    return fail("--dma-prepass-chunks needs --dma-mask-scan pipelined or auto, not " + m.dma_mask_scan);
  if (m.dma_core == "gather" && (c.Nq != 1 || !mask_tensor))
    return fail("--dma-core gather needs one query row (--Nq 1) and a mask (--mask ones or --mask topk)");
  if (has("--bwd-chunks") && c.deterministic)
    return fail("--bwd-chunks does not apply to --deterministic, which always runs one chunk");
  if (c.Hkv > 0 && c.H % c.Hkv != 0)
    return fail("--H must be a multiple of --Hkv, got --H " + std::to_string(c.H) + " and --Hkv " +
                std::to_string(c.Hkv));
  if (m.mask == "topk" && !m.bias) return fail("--mask topk selects keys by the bias: add --bias");
  if (o.program == Program::kDenseBackward) {
    if (d.sweep) return fail("--sweep does not apply to --bwd: the dense backward runs one shape");
    if (d.torch_reference)
      return fail("--reference torch does not apply to --bwd: the backward is checked against attnlab's fp32 "
                  "reference backward");
  }
  // Block-sparse attention: its specs (mods.h's parser) and the flags that mean nothing with it.
  for (const char* f : {"--score-mod", "--block-size"})
    if (has(f) && !blocksparse) return fail(std::string(f) + " needs --mask-mod");
  if (blocksparse) {
    std::string why;
    const int L = std::max(c.Nq, c.Nk);
    s.document_count = std::min(s.document_count, L);
    const std::string mask_spec = split_document_count(s.mask_mod, L, &s.document_count, &why);
    // The mods that read a tensor, which only a caller can supply (attnlab.flex_attention), are not the
    // harness's: its lists leave them out.
    if (mask_spec == "tensor")
      return fail("--mask-mod tensor reads a keep tensor, which the harness does not make (attnlab.flex_attention "
                  "takes one); the harness's mask_mods: " + mask_mod_names(false));
    if (s.score_mod == "bias")
      return fail("--score-mod bias reads a bias tensor, which the harness does not make (attnlab.flex_attention "
                  "takes one; --bias is the dynamic-mask mode's); the harness's score_mods: " + score_mod_names(false));
    if (why.empty()) parse_mask_mod(mask_spec, c.Nq, c.Nk, why);
    if (why.rfind("unknown mask_mod", 0) == 0)
      return fail("--mask-mod: unknown mask_mod '" + s.mask_mod + "' (" + mask_mod_names(false) + ")");
    if (!why.empty()) return fail(why.rfind("--mask-mod", 0) == 0 ? why : "--mask-mod: " + why);
    if (!s.score_mod.empty()) parse_score_mod(s.score_mod, c.H, why);
    if (why.rfind("unknown score_mod", 0) == 0)
      return fail("--score-mod: unknown score_mod '" + s.score_mod + "' (" + score_mod_names(false) + ")");
    if (!why.empty()) return fail("--score-mod: " + why);
    for (const std::string& f : given)
      if (dynamic_mask_options.count(f))
        return fail("--mask-mod and " + f + " belong to two modes (block-sparse, dynamic-mask): give one" +
                    (f == "--softcap" ? " (a softcap here is --score-mod softcap:C)" : ""));
    if (has("--causal")) return fail("--causal does not apply to --mask-mod: the causal mask is --mask-mod causal");
    if (d.sweep) return fail("--sweep does not apply to --mask-mod: it runs one shape");
    if (has("--variant"))
      return fail("--variant does not apply to --mask-mod: its rows are fixed (blocksparse and the SDPA peers)");
    if (has("--reference"))
      return fail("--reference does not apply to --mask-mod: the check uses the mask_mod/score_mod reference");
    if (has("--torch")) return fail("--torch does not apply to --mask-mod: its peers are torch's SDPA (--sdpa)");
    if (d.show_all) return fail("--show-all does not apply to --mask-mod: it shows every row");
  }
  if (o.program != Program::kDynamicMask)
    for (const std::string& f : given)
      if (dynamic_mask_options.count(f))
        return fail(f + " is an option of dynamic-mask attention: add --mask M (none, causal, ones or topk) to run it");
  if (o.program == Program::kDynamicMask) {
    if (d.sweep) return fail("--sweep does not apply to dynamic-mask runs");
    if (c.Dv != c.D) return fail("dynamic-mask attention needs Dv == D");
    if (has("--variant")) return fail("--variant does not apply to dynamic-mask runs: their rows are fixed");
    if (d.show_all) return fail("--show-all does not apply to dynamic-mask runs: they show every row");
    if (has("--reference"))
      return fail("--reference does not apply to dynamic-mask runs: --check uses dmattn's fp32 reference");
  }
  return r;
}

AttnProblem to_problem(const CommonOptions& c) {
  AttnProblem p;
  p.B = c.B;
  p.H = c.H;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.D = c.D;
  p.Dv = c.Dv;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.scale = default_scale(c.D);
  return p;
}

}  // namespace attnlab
