// attnlab: command-line options of flash_attn_mma (host-only, unit-tested):
// the options of each program, and the parser. The flags themselves, with
// their programs and help lines, are the table of cli_flags.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "host/attn_problem.h"

namespace attnlab {

// flash_attn_mma runs one of six programs, each with its own rows and
// options: --mask-mod selects block-sparse attention, --mask dynamic-mask
// attention, --varlen variable-length attention, --decode paged decoding,
// none of them the dense forward; --bwd the backward of the one selected (the
// dense forward's is a program of its own; variable-length attention has none
// yet, paged decoding none at all).
enum class Program {
  kDenseForward,   // the ladder's rungs and the peers (the default)
  kDenseBackward,  // the backward rungs and torch's backward (--bwd)
  kDynamicMask,    // dmattn, flash-dmattn's semantics (bench/dmattn_mode.h)
  kBlocksparse,    // FlexAttention's model (--mask-mod, bench/blocksparse_mode.h)
  kVarlen,         // a packed batch of sequences of different lengths (--varlen, bench/varlen_mode.h)
  kDecode,         // new tokens against a paged KV cache (--decode, bench/decode_mode.h)
};

// What every program reads: the shape, the runs, the check, the peers, where
// the rows go.
struct CommonOptions {
  int B = 1, H = 8;
  int Hkv = 0;  // KV heads (0: = H); GQA/MQA
  int Nq = 4096, Nk = 4096;
  int D = 64, Dv = 64;
  DType dtype = DType::kFloat16;
  bool causal = false;
  int warmup = 2, iters = 10;
  uint64_t seed = 0;
  bool seed_given = false;
  bool check = true;  // check every row against the reference (--no-check: timing only)
  // The peers: every group this build has, unless --torch / --sdpa pick
  // groups or --no-peers drops them all.
  bool torch = true;         // the unfused baselines: `unfused`, and `torch(unfused)` in a torch build
  bool sdpa = true;          // torch's SDPA backends (rows only in a torch build)
  bool peers_given = false;  // --torch or --sdpa picked the groups (--sdpa then needs a torch build)
  bool bwd = false;            // the program's backward instead of its forward
  bool deterministic = false;  // the backward's deterministic mode (bitwise reproducible)
  bool list = false;
  bool help = false;
  std::string csv;  // append rows here when non-empty
};

// The dense forward's and the dense backward's own options.
struct DenseOptions {
  std::string variant_glob = "*";
  bool show_all = false;
  bool torch_reference = false;  // --reference torch: check against torch's fp32 math SDPA
  bool sweep = false;            // the forward on the grid below instead of one shape
  std::vector<int> sweep_N = {1024, 2048, 4096, 8192, 16384, 32768};
  std::vector<int> sweep_D = {32, 64, 128, 256, 512, 1024};
  std::vector<int> sweep_causal = {0, 1};
};

// Dynamic-mask attention's options (kernels/dmattn/).
struct DynamicMaskOptions {
  std::string mask;           // none | causal | topk | ones
  int window = 1024;          // --mask topk: keys kept per query
  int block = 64;             // --mask topk: majority-vote smoothing per key block (0: off)
  bool bias = false;          // a random per-key bias, shape (B, Hkv, 1, Nk) as in flash-dmattn
  float softcap = 0.f;
  int splits = 0;             // split-KV parts (0: automatic)
  std::string dma_core = "auto";  // the forward's tensor-core path: auto | mma | wgmma
  std::string dma_mask_scan = "auto";  // where the forward reads the mask: auto | prepass | in-kernel | pipelined
  int dma_prepass_chunks = 0;          // the pipelined pre-pass's chunks (0: automatic)
  int bwd_chunks = 0;         // the backward's query chunks per key tile (0: automatic)
  bool bwd_rotate = true;     // the backward's query tiles walked from per-key-tile offsets (--bwd-walk-in-order: false)
  bool bwd_own_prepass = false;  // the backward's own mask pre-pass, not the forward's summary (--bwd-own-prepass)
  bool mask_bits = false;        // also rows on the mask bit-packed (--mask-bits)
};

// Block-sparse attention's options (kernels/blocksparse/).
struct BlocksparseOptions {
  std::string mask_mod;       // a mask_mod spec of blocksparse/mods.h ("causal", "sliding_window:128,0", ...),
                              // "document" with the ids made by the harness (document_count of them)
  std::string score_mod;      // a score_mod spec ("" = none)
  int block_q = 128, block_kv = 128;  // --block-size Q,KV
  int document_count = 4;     // --mask-mod document:K: K documents of random lengths (from --seed)
};

// Sequence lengths as --varlen, --varlen-k and --decode give them: a list,
// or random:B,MEAN, B lengths drawn from the run's seed when it starts
// (varlen_lengths, bench/varlen_mode.h; decode_lengths, bench/decode_mode.h).
struct VarlenLengths {
  std::string text;          // as given ("8192,1,517,3000", "random:64,1024"); "" when not given
  std::vector<int> lengths;  // the list; empty for random:B,MEAN
  int random_count = 0;      // random:B,MEAN: B (0: a list)
  int random_mean = 0;       //                MEAN
  bool given() const { return !text.empty(); }
  bool random() const { return random_count > 0; }
  int count() const { return random() ? random_count : int(lengths.size()); }
};

// Variable-length attention's options (kernels/varlen/).
struct VarlenOptions {
  VarlenLengths q;          // --varlen: the query lengths, and the key lengths without --varlen-k
  VarlenLengths k;          // --varlen-k: the key lengths, one per sequence
  bool unverified = false;  // --unverified: run a kernel that has not run on a GPU yet
};

// Paged decoding's options (kernels/varlen/paged_decode.h). Its new tokens
// per sequence are CommonOptions::Nq (--Nq, default 1 here) and its mask
// CommonOptions::causal (default on here: decoding is causal; --no-causal).
struct DecodeOptions {
  VarlenLengths lengths;    // --decode: the cache length of each sequence, as --varlen's lengths
  int page_size = 64;       // --page-size: rows of the cache per page
  bool unverified = false;  // --unverified: run a kernel that has not run on a GPU yet
};

// Every program's options; a program reads `common` and its own part.
struct Options {
  Program program = Program::kDenseForward;
  CommonOptions common;
  DenseOptions dense;                // the dense forward and backward
  DynamicMaskOptions dynamic_mask;   // dynamic-mask attention
  BlocksparseOptions blocksparse;    // block-sparse attention
  VarlenOptions varlen;              // variable-length attention
  DecodeOptions decode;              // paged decoding
};

struct ParseResult {
  Options options;
  std::string error;  // one line, empty on success
  bool ok() const { return error.empty(); }
};

// The process exit codes of flash_attn_mma (documented in usage()).
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;      // a check failed, or the run failed (a GPU error, a lost CSV write)
constexpr int kExitBadOptions = 2;  // the options are wrong; nothing ran
constexpr int kExitNoGpu = 3;       // no usable CUDA GPU; nothing ran

// Parses argv[1..]; accepts "--flag value" and "--flag=value", each option at
// most once. Every error the options alone can show is found here, in one
// line: unknown or repeated flags, a flag of another program than the one
// selected, malformed or out-of-range values, and options that mean nothing
// without another one (e.g. --window without --mask topk).
ParseResult parse_args(const std::vector<std::string>& args);
std::string usage();  // --help, written from the flag table
AttnProblem to_problem(const CommonOptions& o);

}  // namespace attnlab
