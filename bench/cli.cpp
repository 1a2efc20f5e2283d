#include "cli.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

namespace attnlab {
namespace {

constexpr long kMaxBatchOrHeads = 65535;   // grid-dimension limits of the kernels
constexpr long kMaxSeqLen = 1L << 30;
constexpr long kMaxHeadDim = 1024;

// Strict integer parse: the whole string, in range. Returns an error or "".
std::string parse_int(const std::string& flag, const std::string& text, long lo, long hi, int* out) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE)
    return flag + " expects an integer, got '" + text + "'";
  if (v < lo || v > hi)
    return flag + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + text;
  *out = int(v);
  return "";
}

// Comma-separated integers, each in range.
std::string parse_int_list(const std::string& flag, const std::string& text, long lo, long hi, std::vector<int>* out) {
  std::vector<int> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int v = 0;
    if (std::string e = parse_int(flag, item, lo, hi, &v); !e.empty()) return e;
    values.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  *out = values;
  return "";
}

}  // namespace

std::string usage() {
  return R"(flash_attn_mma — time and check every attention variant on one shape

usage: flash_attn_mma [options]
  --B N             batch size (default 1)
  --H N             heads (default 8)
  --N N             sequence length of queries and keys (default 4096)
  --Nq N, --Nk N    query / key lengths when they differ (override --N)
  --D N             head dim of Q and K (default 64)
  --Dv N            head dim of V and O (default: --D)
  --dtype T         fp16 | bf16 (default fp16)
  --causal          causal mask, bottom-right aligned when Nq != Nk
  --warmup N        untimed runs per variant (default 2)
  --iters N         timed runs per variant; the median is reported (default 10)
  --seed N          input seed (default: from the clock, printed in the banner)
  --check           check every row against the fp32 reference; exit 1 on any FAIL
  --show-all        show every row (default: only rows that beat the best so far,
                    plus failures and unsupported rows)
  --variant GLOB    run only variants whose name matches, e.g. 'split-q*';
                    several globs separated by commas: 'ws*,wgmma+stage2*'
  --torch           include the unfused baselines: `unfused` (cuBLAS + softmax +
                    cuBLAS) and, in a torch build, `torch(unfused)`
  --sdpa            include torch's SDPA backends: sdpa(flash) (FA2), sdpa(cudnn),
                    sdpa(efficient) (needs a build that found PyTorch)
  --reference R     fp32 (attnlab's fp32 GPU reference, default) | torch (torch's
                    math SDPA on fp32 copies; needs a torch build)
  --sweep           run a grid of shapes (B, H as given) and print one line per
                    shape; rows go to --csv. Grid: --sweep-N 1024,...,32768
                    --sweep-D 32,64,128,256,512,1024 --sweep-causal 0,1
  --csv FILE        append every row to FILE (with GPU, driver, CUDA, commit, date)

dynamic-mask attention (flash-dmattn semantics; any of these selects it):
  --Hkv N           KV heads, H a multiple of N (GQA/MQA; default: --H)
  --mask M          none | causal | ones (an all-ones mask) | topk (per query,
                    the --window keys of largest bias, smoothed per --block keys)
  --window W        keys kept per query by --mask topk (default 1024)
  --block N         majority-vote block of --mask topk (default 64, 0 = off)
  --bias            add a random per-key bias of shape (B, Hkv, 1, Nk)
  --softcap C       S = C·tanh(S / C) after the bias (default off)
  --bwd             also the backward: dmattn's (dQ, dK, dV, dBias) and, with
                    --sdpa/--torch, torch's through autograd; TFLOPS count
                    2·(3D+2Dv)·pairs
  --deterministic   the backward in its deterministic mode (implies --bwd):
                    gradients bitwise identical run to run; with --check also
                    verified over 5 runs
  --bwd-walk-in-order  the backward's key tiles all walk their query tiles
                    from the first (default: key tile j from query tile j,
                    wrapping); for A/B runs; implies --bwd
  --bwd-own-prepass  the backward runs its own mask pre-pass (default: it
                    reads the tile bits the forward's pre-pass or in-kernel
                    scan stored, as in training); the time of a backward
                    called alone; implies --bwd
  --mask-bits       also run dmattn on the same mask bit-packed (one bit per
                    query and key, DmaMaskFormat::kBits; packed once by
                    dma_pack_mask_bits, outside the timed calls): rows
                    'dmattn (bit-packed mask)' and, with --bwd, 'dmattn bwd
                    (bit-packed mask)'; needs --mask ones or topk
  --bwd-chunks N    the backward's query chunks: blocks sharing one 64-key
                    tile's walk over the query tiles, adding dK, dV through
                    fp32 atomics (implies --bwd; default 0 = automatic, 1 = one
                    block per key tile; the deterministic mode always uses 1)
  --splits N        split-KV parts per query block, merged by LSE (default 0 =
                    automatic: more than one only when the query blocks alone
                    would leave SMs idle, e.g. decoding with --Nq 1)
  --dma-core C      the forward's kernel: auto (default: gather for --Nq 1
                    with a mask, else wgmma on an sm_90 GPU for D in {64, 128},
                    else mma), mma, wgmma (K, V by TMA where aligned),
                    wgmma-cp.async (K, V by cp.async), gather (decoding: the
                    active keys' K and V rows only, not their 64-key tiles)
  --dma-mask-scan S where the forward reads the mask for its skip test: auto
                    (default: in-kernel when at most two blocks share a mask
                    byte and a block scans at most 16K keys, else pipelined
                    where it can be, else prepass), prepass (a kernel summarises the mask
                    into tile bits first), in-kernel (each block reads its rows),
                    pipelined (the pre-pass in chunks of query tiles, each
                    chunk's forward on a side stream as soon as its bits exist)
  --dma-prepass-chunks N  pipelined: the pre-pass's chunks (0: automatic, 4;
                    at most 16)
  Rows: dmattn (ours; effective TFLOPS count unmasked pairs only; the share of
  64x64 tiles skipped), the dense split-q+stage2 rung on the same shape, and
  with --sdpa/--torch torch given the same mask as an additive float mask:
  sdpa(efficient), sdpa(cudnn), torch(unfused), and sdpa(default), torch's
  own entry point (its note says which backend torch picks there).
  --list            list the variants and their tile configurations
  --help            this text
)";
}

ParseResult parse_args(const std::vector<std::string>& args) {
  ParseResult r;
  Options& o = r.options;
  int n = -1, nq = -1, nk = -1, dv = -1;
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

    if (flag == "--B") int_flag(1, kMaxBatchOrHeads, &o.B);
    else if (flag == "--H") int_flag(1, kMaxBatchOrHeads, &o.H);
    else if (flag == "--N") int_flag(1, kMaxSeqLen, &n);
    else if (flag == "--Nq") int_flag(1, kMaxSeqLen, &nq);
    else if (flag == "--Nk") int_flag(1, kMaxSeqLen, &nk);
    else if (flag == "--D") int_flag(1, kMaxHeadDim, &o.D);
    else if (flag == "--Dv") int_flag(1, kMaxHeadDim, &dv);
    else if (flag == "--warmup") int_flag(0, 100000, &o.warmup);
    else if (flag == "--iters") int_flag(1, 100000, &o.iters);
    else if (flag == "--seed") {
      if (take_value()) {
        errno = 0;
        char* end = nullptr;
        const unsigned long long s = std::strtoull(value.c_str(), &end, 10);
        if (value.empty() || value[0] == '-' || *end != '\0' || errno == ERANGE)
          r.error = "--seed expects a non-negative integer, got '" + value + "'";
        o.seed = s;
        o.seed_given = true;
      }
    } else if (flag == "--dtype") {
      if (take_value()) {
        if (value == "fp16" || value == "float16" || value == "half") o.dtype = DType::kFloat16;
        else if (value == "bf16" || value == "bfloat16") o.dtype = DType::kBFloat16;
        else r.error = "--dtype must be fp16 or bf16, got '" + value + "'";
      }
    } else if (flag == "--variant") {
      if (take_value()) o.variant_glob = value;
    } else if (flag == "--csv") {
      if (take_value()) {
        if (value.empty()) r.error = "--csv needs a file name";
        o.csv = value;
      }
    } else if (flag == "--causal") bool_flag(&o.causal);
    else if (flag == "--check") bool_flag(&o.check);
    else if (flag == "--show-all" || flag == "--show") bool_flag(&o.show_all);
    else if (flag == "--torch") bool_flag(&o.torch);
    else if (flag == "--sdpa") bool_flag(&o.sdpa);
    else if (flag == "--sweep") bool_flag(&o.sweep);
    else if (flag == "--sweep-N") { if (take_value()) r.error = parse_int_list(flag, value, 1, kMaxSeqLen, &o.sweep_N); }
    else if (flag == "--sweep-D") { if (take_value()) r.error = parse_int_list(flag, value, 1, kMaxHeadDim, &o.sweep_D); }
    else if (flag == "--sweep-causal") { if (take_value()) r.error = parse_int_list(flag, value, 0, 1, &o.sweep_causal); }
    else if (flag == "--reference") {
      if (take_value()) {
        if (value == "fp32") o.torch_reference = false;
        else if (value == "torch") o.torch_reference = true;
        else r.error = "--reference must be fp32 or torch, got '" + value + "'";
      }
    }
    else if (flag == "--Hkv") int_flag(1, kMaxBatchOrHeads, &o.Hkv);
    else if (flag == "--mask") {
      if (take_value()) {
        if (value == "none" || value == "causal" || value == "topk" || value == "ones") o.mask = value;
        else r.error = "--mask must be none, causal, ones or topk, got '" + value + "'";
      }
    } else if (flag == "--window") int_flag(0, kMaxSeqLen, &o.window);
    else if (flag == "--block") int_flag(0, 65536, &o.block);
    else if (flag == "--bias") bool_flag(&o.bias);
    else if (flag == "--splits") int_flag(0, 1024, &o.splits);
    else if (flag == "--dma-core") {
      if (take_value()) {
        if (value == "auto" || value == "mma" || value == "wgmma" || value == "wgmma-cp.async" || value == "gather")
          o.dma_core = value;
        else r.error = "--dma-core must be auto, mma, wgmma, wgmma-cp.async or gather, got '" + value + "'";
      }
    }
    else if (flag == "--dma-mask-scan") {
      if (take_value()) {
        if (value == "auto" || value == "prepass" || value == "in-kernel" || value == "pipelined")
          o.dma_mask_scan = value;
        else r.error = "--dma-mask-scan must be auto, prepass, in-kernel or pipelined, got '" + value + "'";
      }
    }
    else if (flag == "--dma-prepass-chunks") int_flag(0, 16, &o.dma_prepass_chunks);
    else if (flag == "--bwd") bool_flag(&o.bwd);
    else if (flag == "--deterministic") { bool_flag(&o.deterministic); o.bwd = o.bwd || o.deterministic; }
    else if (flag == "--bwd-chunks") { int_flag(0, 4096, &o.bwd_chunks); o.bwd = true; }
    else if (flag == "--bwd-walk-in-order") {
      bool in_order = false;
      bool_flag(&in_order);
      o.bwd_rotate = o.bwd_rotate && !in_order;
      o.bwd = true;
    }
    else if (flag == "--bwd-own-prepass") { bool_flag(&o.bwd_own_prepass); o.bwd = true; }
    else if (flag == "--mask-bits") bool_flag(&o.mask_bits);
    else if (flag == "--softcap") {
      if (take_value()) {
        char* end = nullptr;
        const float c = std::strtof(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(c >= 0.f) || c > 1e6f) r.error = "--softcap expects a number >= 0, got '" + value + "'";
        else o.softcap = c;
      }
    }
    else if (flag == "--list") bool_flag(&o.list);
    else if (flag == "--help" || flag == "-h") bool_flag(&o.help);
    else r.error = "unknown option '" + args[i] + "' (see --help)";
    if (!r.error.empty()) return r;
  }
  if (n > 0) o.Nq = o.Nk = n;
  if (nq > 0) o.Nq = nq;
  if (nk > 0) o.Nk = nk;
  o.Dv = dv > 0 ? dv : o.D;
  if (o.mask == "causal") o.causal = true;
  if (o.Hkv > 0 && o.H % o.Hkv != 0) r.error = "--H must be a multiple of --Hkv";
  if (o.mask == "topk" && !o.bias) r.error = "--mask topk selects keys by the bias: add --bias";
  if (o.mask_bits && o.mask != "topk" && o.mask != "ones")
    r.error = "--mask-bits packs the mask: add --mask ones or --mask topk";
  if (o.dynamic_mask() && o.sweep) r.error = "--sweep does not apply to dynamic-mask runs";
  if (o.dynamic_mask() && o.Dv != o.D) r.error = "dynamic-mask attention needs Dv == D";
  return r;
}

AttnProblem to_problem(const Options& o) {
  AttnProblem p;
  p.B = o.B;
  p.H = o.H;
  p.Nq = o.Nq;
  p.Nk = o.Nk;
  p.D = o.D;
  p.Dv = o.Dv;
  p.dtype = o.dtype;
  p.causal = o.causal;
  p.scale = default_scale(o.D);
  return p;
}

namespace {
bool glob_match_one(const std::string& pattern, const std::string& text) {
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace

bool glob_match(const std::string& patterns, const std::string& text) {
  size_t begin = 0;
  while (true) {  // comma-separated alternatives (variant names have no commas)
    const size_t end = patterns.find(',', begin);
    if (glob_match_one(patterns.substr(begin, end == std::string::npos ? std::string::npos : end - begin), text))
      return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}

}  // namespace attnlab
