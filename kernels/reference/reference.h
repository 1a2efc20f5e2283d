// attnlab: references and the correctness rule every variant is held to.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "host/attn_problem.h"
#include "host/variant.h"

namespace attnlab {

// Largest head dim the references handle (D and Dv).
constexpr int kMaxReferenceHeadDim = 1024;

// ---- fp32 GPU reference --------------------------------------------------
// Deliberately simple: one block per query row, scores in fp32 from the 16-bit
// inputs, accurate expf, two passes per chunk of keys; K and V of Hkv heads.
// O_ref: [B, H, Nq, Dv] fp32; lse_ref: [B, H, Nq] (-inf for a row that sees no
// key, whose O row is 0).
cudaError_t reference_attention_fp32(const AttnProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                                     float* lse_ref, cudaStream_t stream);

// ---- fp32 GPU reference backward -------------------------------------------
// The gradients of L = Σ O ⊙ dO, unfused, from cuBLAS fp32 GEMMs per KV head
// (its H / Hkv query heads stacked as rows, so that dK and dV sum over them):
//   S = scale·Q·Kᵀ, P = softmax(S) (masked keys 0), dP = dO·Vᵀ,
//   dS = P ∘ (dP − rowsum(P ∘ dP)), dV = Pᵀ·dO, dK = scale·dSᵀ·Q, dQ = scale·dS·K
// S/P and dP/dS are materialised for as many rows as the workspace holds:
// whole KV heads at a time, or blocks of one KV head's rows (dK, dV then
// accumulate over the blocks). Outputs fp32: dq [B,H,Nq,D], dk [B,Hkv,Nk,D],
// dv [B,Hkv,Nk,Dv]. A row that sees no key has P = 0: its dQ row is 0 and it
// adds nothing to dK, dV. Any Nq, Nk, D != Dv.
// low_precision: as an unfused fp16/bf16 backward computes it: S, P, dP, dS
// and the gradients rounded to the input dtype where such a backward stores
// them (its GEMMs accumulate in fp32). Its error against the fp32 one is the
// yardstick of the backward check rule (the same-precision unfused error).
// workspace: reference_backward_workspace_bytes(p, rows) for some rows >= 1
// (more rows, fewer GEMM launches), or nullptr: then it allocates what fits
// itself and frees it before it returns (which then waits for the GPU).
cudaError_t reference_attention_backward_fp32(const AttnProblem& p, const void* q, const void* k, const void* v,
                                              const void* dout, float* dq, float* dk, float* dv, bool low_precision,
                                              void* workspace, size_t workspace_bytes, cudaStream_t stream);
// The inputs as fp32, and S and dP for `rows` stacked query rows.
size_t reference_backward_workspace_bytes(const AttnProblem& p, int64_t rows);

// ---- the unfused baseline ------------------------------------------------
// cuBLAS S = scale·Q·Kᵀ, a softmax kernel, cuBLAS O = P·V, all in the input
// precision with fp32 accumulation. S is materialised in the workspace, as
// many heads at a time as the workspace holds. Shown as the `unfused` row.
Variant make_unfused_baseline();
// Its workspace comes in whole KV heads, each the S of its H / Hkv query
// heads: the least it runs in, and the unit the harness hands out.
size_t unfused_workspace_granule(const AttnProblem& p);

// ---- inputs --------------------------------------------------------------
// Standard-normal 16-bit values from a counter-based hash of (seed, index):
// reproducible for a seed, different for every seed, never zeros or ones.
cudaError_t fill_random_normal(void* x, int64_t n, DType dtype, uint64_t seed, cudaStream_t stream);

// fp32 values rounded to the input dtype (e.g. the fp32 reference's O as the
// forward output a backward starts from).
cudaError_t convert_fp32_to_input_dtype(const float* x, void* out, int64_t n, DType dtype, cudaStream_t stream);

// ---- comparison ----------------------------------------------------------
struct ErrorStats {
  double max_abs_err = 0;  // over finite elements
  int64_t nonfinite = 0;   // elements that are NaN/Inf where the reference is finite
                           // (or finite where the reference is -inf, for LSE)
};

// |out - ref| for a 16-bit output against the fp32 reference.
ErrorStats compare_output(const void* out, DType dtype, const float* ref, int64_t n, cudaStream_t stream);
// The same for an fp32 output (e.g. a reference computed another way).
ErrorStats compare_output_fp32(const float* out, const float* ref, int64_t n, cudaStream_t stream);
// |lse - ref| for fp32 LSE; -inf must match -inf exactly.
ErrorStats compare_lse(const float* lse, const float* lse_ref, int64_t n, cudaStream_t stream);
// The rounding error of the reference itself in the output dtype, as
// FlashAttention's tests measure it: max |rnd(ref + 0.3) - 0.3 - ref|.
double output_rounding_error(const float* ref, int64_t n, DType dtype, cudaStream_t stream);

// ---- the correctness rule (one function, used everywhere) ----------------
// A variant passes when
//   max|O - O_ref| <= 2 · max|O_unfused - O_ref| + 2 · rounding error   (FlashAttention's rule)
//   max|LSE - LSE_ref| <= kLseTolerance
//   and no element is NaN, Inf or unwritten (outputs are poisoned with NaN first).
//   (kLseTolerance for every variant that keeps S in fp32; a peer that rounds
//   S to the input dtype first — the unfused baseline — gets
//   lse_tolerance_rounded_scores: LSE = log Σ exp S moves by Σ P·ΔS, at most
//   u·max|S| <= u·max|LSE| plus the exp's spread, so 2·u·max|LSE_ref| on top.)
constexpr double kLseTolerance = 1e-3;
double lse_tolerance_rounded_scores(DType dtype, double max_abs_lse_ref);

struct CheckResult {
  bool pass = false;
  double err = 0;      // max |O - O_ref|
  double tol = 0;      // the bound err is held to
  double lse_err = 0;  // max |LSE - LSE_ref|
  double lse_tol = kLseTolerance;  // the bound lse_err is held to
  int64_t nonfinite = 0;
  std::string summary() const;  // "PASS err 9.8e-04 <= 2.4e-03, lse 2.1e-06"
};

// Judges already-measured errors; `baseline_err` is the unfused error (or < 0
// when no baseline could run, in which case the tolerance is the rounding error
// times kNoBaselineFactor).
constexpr double kNoBaselineFactor = 8.0;
CheckResult judge(const ErrorStats& out, const ErrorStats& lse, double baseline_err, double rounding_err,
                  double lse_tol = kLseTolerance);

// Everything needed to check a variant's outputs on one problem.
struct ReferenceData {
  const float* o_ref = nullptr;    // [B, H, Nq, Dv] fp32
  const float* lse_ref = nullptr;  // [B, H, Nq]
  double baseline_err = -1;        // max |O_unfused - O_ref|, < 0 if unavailable
  double rounding_err = 0;         // output_rounding_error(o_ref)
};
// `lse` may be null for an output without LSE; then only O is judged.
// lse_tol: kLseTolerance, or lse_tolerance_rounded_scores for a peer that rounds S.
CheckResult check_outputs(const AttnProblem& p, const void* o, const float* lse, const ReferenceData& ref,
                          cudaStream_t stream, double lse_tol = kLseTolerance);
// max |LSE_ref| over the finite entries (a fully masked row's -inf is left out).
double max_abs_finite_lse(const float* lse_ref, int64_t n, cudaStream_t stream);

// Poisons O and LSE with NaN (0xFF bytes) so unwritten elements are caught.
cudaError_t poison_outputs(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream);

// ---- CPU double-precision reference (tests) ------------------------------
// Inputs as double, row-major: Q [B, H, Nq, D], K [B, Hkv, Nk, D], V [B, Hkv,
// Nk, Dv]; same semantics as the GPU reference.
void reference_attention_cpu(const AttnProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, std::vector<double>& o, std::vector<double>& lse);
// The backward of L = Σ O ⊙ dO (dout [B, H, Nq, Dv]): dq, dk, dv in the
// shapes of q, k, v, dk and dv summed over the query heads of a KV head.
void reference_attention_backward_cpu(const AttnProblem& p, const std::vector<double>& q,
                                      const std::vector<double>& k, const std::vector<double>& v,
                                      const std::vector<double>& dout, std::vector<double>& dq,
                                      std::vector<double>& dk, std::vector<double>& dv);

}  // namespace attnlab
