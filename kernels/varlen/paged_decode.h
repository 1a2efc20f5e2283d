// attnlab: decoding against a paged KV cache (FlashAttention's
// flash_attn_with_kvcache with a block table; vLLM's paged attention) — the
// host API. Kernel and tiles: kernels/varlen/paged_decode.cu.
//
//   q        [B, Nq, H, D]             Nq new tokens per sequence (1: decoding; up
//                                      to 16: speculative decoding)
//   k_cache  [num_pages, page_size, Hkv, D]
//   v_cache  [num_pages, page_size, Hkv, Dv]
//   block_table [B, max_pages] int32   sequence b's key j is row j % page_size of
//                                      page block_table[b][j / page_size]
//   cache_seqlens [B] int32            sequence b's keys: 0 .. cache_seqlens[b] − 1
//   o [B, Nq, H, Dv], lse [B, H, Nq] fp32 (natural log)
//
// The new tokens are the cache's last Nq keys (their K and V already written):
// causal, token t sees keys 0 .. cache_seqlens[b] − Nq + t (bottom-right); not
// causal, every key. A row that sees no key gets O = 0, LSE = −inf.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "host/attn_problem.h"

namespace attnlab {

// The cache's shape; `shape` holds B, H, Hkv, D, Dv, dtype, causal, scale, and
// Nq (new tokens per sequence); its Nk is unused.
struct PagedDecodeProblem {
  AttnProblem shape;
  int num_pages = 0, page_size = 0, max_pages = 0;  // max_pages: the block table's columns
  int max_keys() const { return max_pages * page_size; }
  std::string shape_string() const;  // "decode B=8 Nq=1, pages 64 x 1024 (table 8 x 32), H=32, Hkv=8, D=128, bf16"
};

struct PagedDecodeBuffers {
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int* block_table = nullptr;    // device
  const int* cache_seqlens = nullptr;  // device
  void* o = nullptr;
  float* lse = nullptr;
  void* workspace = nullptr;  // paged_decode_workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
};

// Why the table and lengths (host copies) do not fit problem dp ("" when they
// do): B·max_pages entries, each a page in [0, num_pages) where the sequence
// reads it; B lengths in [0, max_pages·page_size].
std::string paged_decode_tables_invalid(const PagedDecodeProblem& dp, const std::vector<int>& block_table,
                                        const std::vector<int>& cache_seqlens);

// Why no kernel runs dp ("" when one does): head dims, Nq, heads, the device.
std::string paged_decode_unsupported(const PagedDecodeProblem& dp);

// How many blocks split each sequence's keys (flash-decoding), for `sms` SMs.
int paged_decode_splits(const PagedDecodeProblem& dp, int sms);

// The workspace: the splits' partial O and LSE (fp32).
size_t paged_decode_workspace_bytes(const PagedDecodeProblem& dp);

// O and LSE: the split kernel, then the merge of the splits. Asynchronous on
// `stream`; page indices out of range are clamped into the cache (the host
// checks them, paged_decode_tables_invalid), never read past it.
cudaError_t paged_decode(const PagedDecodeProblem& dp, const PagedDecodeBuffers& b, cudaStream_t stream);

// The exact count of unmasked (query, key) pairs of one head over the batch.
int64_t paged_decode_pairs_per_head(const PagedDecodeProblem& dp, const std::vector<int>& cache_seqlens);

std::string paged_decode_describe();

}  // namespace attnlab
