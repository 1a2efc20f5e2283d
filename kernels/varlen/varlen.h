// attnlab: attention over a packed batch of sequences of different lengths
// (FlashAttention's flash_attn_varlen_func) on the Hopper engine — the host API.
// Kernels and tile tables: kernels/varlen/varlen_fwd.cu, varlen_bwd.cu.
//
//   sequence b: rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of Q and O,
//               rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of K and V
//   Q [total_q, H, D], K [total_k, Hkv, D], V [total_k, Hkv, Dv], O [total_q, H, Dv]
//   LSE [H, total_q] fp32 (natural log), as FlashAttention's varlen forward
//
// Each sequence is its own attention problem (causal: bottom-right within the
// sequence). Sequences of length 0 are allowed; a query row that sees no key
// (len_k = 0, or causal with len_q > len_k) gets O = 0, LSE = -inf.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "host/attn_problem.h"

namespace attnlab {

// A packed batch: `shape` holds B (sequences), H, Hkv, D, Dv, dtype, causal,
// scale, and max_seqlen_q / max_seqlen_k as Nq / Nk (bounds the host plans
// with; the kernel reads each sequence's lengths from cu_seqlens).
struct VarlenProblem {
  AttnProblem shape;
  int total_q = 0, total_k = 0;  // rows of the packed Q, O and of K, V
  std::string shape_string() const;  // "varlen B=4 (total 11710 / 11710, max 8192), H=8, D=128, fp16, causal"
};

// Device pointers; the caller owns every allocation.
struct VarlenBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int* cu_seqlens_q = nullptr;  // [B + 1], int32, device
  const int* cu_seqlens_k = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  void* workspace = nullptr;  // varlen_fwd_workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
};

// Why cu_seqlens (host copies, B + 1 each) do not describe problem vp ("" when
// they do): offsets from 0, non-decreasing, ending at total_q / total_k, no
// sequence longer than max_seqlen (shape.Nq, shape.Nk).
std::string varlen_lengths_invalid(const VarlenProblem& vp, const std::vector<int>& cu_q, const std::vector<int>& cu_k);

// Why no kernel runs problem vp ("" when one does): the device (sm_90a, TMA),
// the head dims, the grouping of heads, sizes past the order's int range.
std::string varlen_fwd_unsupported(const VarlenProblem& vp);

// The kernel's tile at head dims D, Dv in *Br x *Bc (the order's tiles:
// varlen_schedule.h); false when no config has these head dims. Needs no GPU.
bool varlen_fwd_tile(int D, int Dv, int* Br, int* Bc);

// The workspace varlen_fwd needs: the work order and the item counter.
size_t varlen_fwd_workspace_bytes(const VarlenProblem& vp);

// O and LSE into b.o, b.lse. Two launches on `stream`: the prepare kernel (the
// order from cu_seqlens), then the forward. Asynchronous; cu_seqlens must be
// valid (varlen_lengths_invalid) — malformed offsets are clamped into the
// tensors, never read or written past them.
cudaError_t varlen_fwd(const VarlenProblem& vp, const VarlenBuffers& b, cudaStream_t stream);

// One line per head-dim config: the tile, warps, shared memory, ping-pong.
std::string varlen_fwd_describe();

// ---- the backward ---------------------------------------------------------------
// The gradients of L = Σ O ⊙ dO over every sequence: dQ [total_q, H, D], dK
// [total_k, Hkv, D], dV [total_k, Hkv, Dv] (dK, dV summed over the H / Hkv
// query heads of a KV head), from the forward's O and LSE. A row that sees no
// key contributes nothing; keys that no query sees get dK = dV = 0.
struct VarlenGradBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;     // [total_q, H, Dv], the forward's
  const float* lse = nullptr;  // [H, total_q], the forward's
  const void* dout = nullptr;  // [total_q, H, Dv]
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* workspace = nullptr;  // varlen_bwd_workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
};

// Why no backward kernel runs problem vp ("" when one does).
std::string varlen_bwd_unsupported(const VarlenProblem& vp);

// The workspace varlen_bwd needs: the order, LSE·log2e and Δ per padded row,
// dQ's fp32 accumulator.
size_t varlen_bwd_workspace_bytes(const VarlenProblem& vp);

// dQ, dK, dV into b.dq, b.dk, b.dv. Four launches on `stream`: the prepare
// kernel (the key tiles' order), the pre-pass (Δ, LSE·log2e, the accumulator
// zeroed), the main kernel, dQ's cast. Asynchronous; cu_seqlens as for varlen_fwd.
cudaError_t varlen_bwd(const VarlenProblem& vp, const VarlenGradBuffers& b, cudaStream_t stream);

// One line per head-dim config of the backward.
std::string varlen_bwd_describe();

// The exact count of unmasked (query, key) pairs of one head over the batch,
// for the FLOP convention (2·H·(D + Dv)·pairs forward).
int64_t varlen_unmasked_pairs_per_head(const VarlenProblem& vp, const std::vector<int>& cu_q,
                                       const std::vector<int>& cu_k);

}  // namespace attnlab
