// attnlab: references of attention under a mask_mod and a score_mod
// (kernels/blocksparse/mods.h), pair by pair — what the block-sparse kernels
// compute, without the block mask:
//
//   s = score_mod(scale · q·kᵀ) where mask_mod keeps (q, k), −inf where it drops it
//   O = softmax(s)·V, LSE natural log; a row that sees no key: O = 0, LSE = −inf
//
// Each also computes the same-precision path, the yardstick of the check rule
// (reference.h, judge): an unfused fp16/bf16 kernel's arithmetic — S in fp32
// from the 16-bit inputs, the score_mod in fp32, P = softmax(S) rounded to the
// input dtype before P·V (fp32 accumulation), O rounded to the dtype.
//   CPU (tests):        double, and the same-precision path beside it;
//   GPU (the harness):  fp32, or the same-precision path (low_precision);
//                       one block per query row, two passes over the keys.
// And the backward (GPU, fp32, or the same-precision path), and the exact
// number of pairs a mask_mod keeps (the FLOP count's `pairs`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "blocksparse/mods.h"
#include "host/attn_problem.h"

namespace attnlab {

// s' = score_mod(s) in double, written out from mods.h's definitions (not its
// float functor), and ds'/ds at s: what the CPU references of the forward and
// the backward apply.
double score_mod_double(const ScoreMod& m, double s, int b, int h, int q, int k);
double score_mod_grad_double(const ScoreMod& m, double s);

// q [B,H,Nq,D], k [B,Hkv,Nk,D], v [B,Hkv,Nk,Dv] as doubles (the values of the
// 16-bit inputs); `mask` with its document ids in host memory. o_ref, lse_ref
// in double; o_low: the same-precision path's O (rounded to p.dtype).
void mods_attention_cpu(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score,
                        const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>& o_ref, std::vector<double>& lse_ref, std::vector<double>& o_low);

// The same on the GPU from the 16-bit inputs (`mask` with its document ids in
// device memory): o [B,H,Nq,Dv] and lse [B,H,Nq] fp32. With low_precision, the
// same-precision path (O rounded to the dtype, stored as fp32). Any Nq, Nk; D,
// Dv <= kMaxReferenceHeadDim. Asynchronous on `stream`.
cudaError_t mods_attention_fp32(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score, const void* q,
                                const void* k, const void* v, float* o, float* lse, bool low_precision,
                                cudaStream_t stream);

// The gradients of L = Σ O ⊙ dO under the mods, from the 16-bit inputs
// (reference_backward.cu: reference.h's unfused cuBLAS backward, with
// P = softmax(score_mod(S)) over the kept pairs and dS times ds'/ds): dq
// [B,H,Nq,D], dk [B,Hkv,Nk,D], dv [B,Hkv,Nk,Dv] fp32; a row that sees no key
// adds nothing. With low_precision, the same-precision unfused backward
// (reference.h's low_precision: S, s', P, dP, dS and the gradients rounded to
// the dtype). p.causal must be false (causality is the mask_mod's). Allocates
// its scratch and frees it before it returns (so it waits for the GPU).
cudaError_t mods_attention_backward_fp32(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score,
                                         const void* q, const void* k, const void* v, const void* dout, float* dq,
                                         float* dk, float* dv, bool low_precision, cudaStream_t stream);

// *pairs (device memory, one counter) += the (b, h, q, k) in [B, H, Nq, Nk]
// that `mask` keeps (document ids in device memory), every pair evaluated.
// Asynchronous on `stream`; zero *pairs first.
cudaError_t count_kept_pairs(const MaskMod& mask, int B, int H, int Nq, int Nk, unsigned long long* pairs,
                             cudaStream_t stream);

}  // namespace attnlab
