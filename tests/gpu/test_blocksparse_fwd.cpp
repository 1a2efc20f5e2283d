// The block-sparse forward (kernels/blocksparse/blocksparse_fwd.h) against
// CPU references that apply the mask_mod and the score_mod pair by pair, on
// fresh normal inputs per case: O and LSE against a double-precision
// reference, held to the project's rule (kernels/reference/reference.h,
// judge): max|O - O_ref| <= 2·(the same-precision error) + 2·(rounding of
// O_ref to the dtype), |LSE - LSE_ref| <= kLseTolerance, nothing NaN or
// unwritten (O and LSE are poisoned with NaN first). The references, the
// same-precision path among them, are mods_attention_cpu's
// (kernels/reference/mods_reference.h). Rows that see no key must hold O = 0,
// LSE = -inf exactly.
// Cases: every mask_mod over lengths 1, 17, 113 x 203, 239 x 1, 799 x 3,
// 300 x 1000, rotating the score_mods, head dims, dtypes, block sizes (every
// multiple of the tile, 128 to 384) and MHA / GQA / MQA; then causal with
// Nq != Nk and whole query blocks that see no key, every score_mod in both
// dtypes, lists broadcast over B and H, 2048-key walks; the mods that read
// tensors — a tensor mask_mod (random keep bits in dmattn's packing, the
// padding bits set) and a bias score_mod (random, in the input dtype), full
// and broadcast, ragged, GQA, both dtypes, each also refused without its
// tensors; the refusals, and a negative control (the kernel given another
// score_mod must fail). Options: gpu_testing.h's CaseArgs (-v, --only TEXT).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../block_mask_cases.h"
#include "../tensor_mods_cases.h"
#include "blocksparse_cases.h"
#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/blocksparse_fwd.h"
#include "blocksparse/mods.h"
#include "dmattn/dmattn.h"
#include "gpu_testing.h"
#include "host/device.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"

using namespace attnlab;
using namespace attnlab::testing;
using namespace attnlab::tensor_mods_cases;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
bool verbose = false;  // -v: one line per case, passing or not
CaseArgs args;

struct Case {
  std::string mask, score;
  int Nq, Nk, D, Dv;
  DType dtype;
  int block_q, block_kv;
  int B, H, Hkv;
  bool broadcast_lists = false;  // one list per query block for every (b, h)
  std::string kernel_score = "";  // a negative control: the kernel runs this score_mod, and must fail
  Form form = Form::kFull;        // the tensor mask_mod's words and the bias

  bool reads_tensors() const { return mask == "tensor" || score == "bias"; }
  std::string name() const {
    char buf[240];
    std::snprintf(buf, sizeof buf, "%s + %s, %dx%d, D=%d/%d, %s, blocks %dx%d, B=%d H=%d Hkv=%d%s%s%s", mask.c_str(),
                  score.c_str(), Nq, Nk, D, Dv, dtype_name(dtype), block_q, block_kv, B, H, Hkv,
                  broadcast_lists ? ", lists broadcast" : "", reads_tensors() ? ", tensors " : "",
                  reads_tensors() ? form_name(form) : "");
    return buf;
  }
};

// Runs one case and records it; false when the GPU is no longer usable.
bool run_case(const Case& c, std::mt19937_64& rng) {
  const std::string what = c.name();
  AttnProblem p;
  p.B = c.B, p.H = c.H, p.Hkv = c.Hkv, p.Nq = c.Nq, p.Nk = c.Nk, p.D = c.D, p.Dv = c.Dv, p.dtype = c.dtype;
  p.scale = default_scale(c.D);
  std::string why;
  MaskMod mask = parse_mask_mod(c.mask, c.Nq, c.Nk, why);
  ScoreMod score = parse_score_mod(c.score, c.H, why);
  ScoreMod kernel_score = c.kernel_score.empty() ? score : parse_score_mod(c.kernel_score, c.H, why);
  if (!why.empty()) {
    record(false, what + ": " + why);
    return true;
  }
  std::vector<uint16_t> qb, kb, vb;
  std::vector<double> q, k, v;
  random_tensor(rng, p.q_elems(), p.dtype, 1.0, qb, q);
  random_tensor(rng, p.k_elems(), p.dtype, 1.0, kb, k);
  random_tensor(rng, p.v_elems(), p.dtype, 1.0, vb, v);
  const PairShape tensor_shape = pair_shape(c.form, c.B, c.H, c.Nq);
  const ModTensors tensors =
      draw_mod_tensors(rng, p, tensor_shape, mask.kind == MaskModKind::kTensor,
                       score.kind == ScoreModKind::kBias || kernel_score.kind == ScoreModKind::kBias);

  DeviceBuffers dev;
  const int lists_B = c.broadcast_lists ? 1 : c.B, lists_H = c.broadcast_lists ? 1 : c.H;
  void* mask_base = dev.alloc<void>(block_mask_device_bytes(lists_B, lists_H, c.Nq, c.Nk, c.block_q, c.block_kv));
  void* dq = dev.alloc<void>(qb.size() * 2);
  void* dk = dev.alloc<void>(kb.size() * 2);
  void* dv = dev.alloc<void>(vb.size() * 2);
  void* d_o = dev.alloc<void>(size_t(p.o_elems()) * 2);
  float* d_lse = dev.alloc<float>(size_t(p.lse_elems()) * 4);
  int32_t* d_doc = dev.alloc<int32_t>(tensors.doc.size() * 4);
  void* workspace = dev.alloc<void>(blocksparse_fwd_workspace_bytes());  // the persistent grid's counter
  uint32_t* d_bits = dev.alloc<uint32_t>(tensors.bits.size() * 4);
  void* d_bias = dev.alloc<void>(tensors.bias_bits.size() * 2);
  if (!mask_base || !dq || !dk || !dv || !d_o || !d_lse || !d_doc || !workspace || !d_bits || !d_bias) {
    record(false, what + ": out of device memory");
    return true;
  }
  cudaMemcpy(dq, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_doc, tensors.doc.data(), tensors.doc.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_bits, tensors.bits.data(), tensors.bits.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_bias, tensors.bias_bits.data(), tensors.bias_bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(mask_base, 0xff, block_mask_device_bytes(lists_B, lists_H, c.Nq, c.Nk, c.block_q, c.block_kv));
  cudaMemset(d_o, 0xff, size_t(p.o_elems()) * 2);  // NaN in both dtypes
  cudaMemset(d_lse, 0xff, size_t(p.lse_elems()) * 4);

  MaskMod dev_mask = mask, host_mask = mask;
  if (mask.kind == MaskModKind::kDocument) {
    dev_mask.doc = d_doc, dev_mask.doc_len = tensors.doc_len;
    host_mask.doc = tensors.doc.data(), host_mask.doc_len = tensors.doc_len;
  }
  const MaskMod bare_mask = dev_mask;  // before the tensors are attached
  const ScoreMod bare_score = kernel_score;
  attach(dev_mask, kernel_score, tensor_shape, p, d_bits, d_bias);
  attach(host_mask, score, tensor_shape, p, tensors.bits.data(), tensors.bias_bits.data());
  const BlockMaskView view = block_mask_view(mask_base, lists_B, lists_H, c.Nq, c.Nk, c.block_q, c.block_kv);
  cudaError_t err = build_block_mask_from_mod(dev_mask, view, nullptr);
  if (const std::string refused = blocksparse_fwd_unsupported(p, view); !refused.empty()) {
    record(false, what + ": unsupported: " + refused);
    return true;
  }
  AttnBuffers buf;
  buf.q = dq, buf.k = dk, buf.v = dv, buf.o = d_o, buf.lse = d_lse;
  buf.workspace = workspace, buf.workspace_bytes = blocksparse_fwd_workspace_bytes();
  cudaMemset(workspace, 0x7f, buf.workspace_bytes);  // a stale counter: the launch must zero it
  if (err == cudaSuccess && c.reads_tensors()) {  // without its tensors, refused before any launch
    const cudaError_t refused = blocksparse_fwd(p, buf, view, bare_mask, bare_score, nullptr);
    record(refused == cudaErrorInvalidValue, what + ": without its tensors must be refused, got " +
                                                 cudaGetErrorString(refused));
    if (refused != cudaErrorInvalidValue) return gpu_still_usable(cudaGetErrorString(refused));
  }
  if (err == cudaSuccess) err = blocksparse_fwd(p, buf, view, dev_mask, kernel_score, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    record(false, what + ": " + cudaGetErrorString(err));
    return gpu_still_usable(cudaGetErrorString(err));
  }
  std::vector<uint16_t> o_bits(size_t(p.o_elems()));
  std::vector<float> lse(size_t(p.lse_elems()));
  cudaMemcpy(o_bits.data(), d_o, o_bits.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost);

  std::vector<double> o_ref, lse_ref, o_low;
  mods_attention_cpu(p, host_mask, score, q, k, v, o_ref, lse_ref, o_low);
  const OutputComparison out = compare_output(o_bits, o_ref, o_low, p.dtype);
  ErrorStats lse_stats;
  int64_t empty_rows_wrong = 0;  // rows that see no key: O exactly 0, LSE exactly -inf
  for (size_t r = 0; r < lse_ref.size(); ++r) {
    if (lse_ref[r] == kNegInf) {
      bool zero = lse[r] == -INFINITY;
      for (int d = 0; d < p.Dv; ++d) zero = zero && from_bits(o_bits[r * p.Dv + d], p.dtype) == 0.0;
      if (!zero) ++empty_rows_wrong;
      if (lse[r] != -INFINITY) ++lse_stats.nonfinite;
    } else if (!std::isfinite(lse[r])) {
      ++lse_stats.nonfinite;
    } else {
      lse_stats.max_abs_err = std::max(lse_stats.max_abs_err, std::fabs(double(lse[r]) - lse_ref[r]));
    }
  }
  const CheckResult r = judge(out.stats, lse_stats, out.baseline_err, out.rounding_err);
  char extra[96] = "";
  if (empty_rows_wrong > 0)
    std::snprintf(extra, sizeof extra, ", %lld rows without keys not O = 0, LSE = -inf",
                  static_cast<long long>(empty_rows_wrong));
  const bool pass = r.pass && empty_rows_wrong == 0;
  if (verbose) std::printf("%s %s: %s%s\n", pass ? "pass" : "fail", what.c_str(), r.summary().c_str(), extra);
  if (!c.kernel_score.empty()) record(!pass, what + " with the kernel's score_mod " + c.kernel_score + " must FAIL");
  else record(pass, what + ": " + r.summary() + extra);
  return true;
}

std::vector<Case> all_cases() {
  struct Shape {
    int Nq, Nk;
  };
  const Shape shapes[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {300, 1000}};
  const char* scores[] = {"none", "rel_bias", "alibi", "softcap:2"};
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}, {128, 64}};
  const int blocks[][2] = {{128, 128}, {256, 256}, {128, 256}, {256, 128}};
  const int heads[][3] = {{2, 2, 2}, {1, 4, 2}, {1, 3, 1}};  // B, H, Hkv: MHA, GQA, MQA
  std::vector<Case> cases;
  int n = 0;
  for (const char* mask : block_mask_cases::kMaskModSpecs)
    for (const Shape& s : shapes) {
      const int* d = dims[n % 5];
      const int* blk = blocks[(n / 5) % 4];
      const int* hd = heads[(n / 2) % 3];
      cases.push_back({mask, scores[n % 4], s.Nq, s.Nk, d[0], d[1], (n / 4) % 2 ? DType::kBFloat16 : DType::kFloat16,
                       blk[0], blk[1], hd[0], hd[1], hd[2]});
      ++n;
    }
  // Causal with Nq != Nk both ways; with Nq > Nk whole query blocks see no key
  // (empty lists: no tile is loaded) and the rows above the diagonal none.
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    cases.push_back({"causal", "none", 1000, 300, 128, 128, t, 128, 128, 2, 2, 2});
    cases.push_back({"causal", "alibi", 1000, 300, 64, 64, t, 256, 256, 1, 4, 1});
    cases.push_back({"causal", "rel_bias", 300, 1000, 128, 128, t, 128, 128, 1, 4, 2});
    cases.push_back({"sliding_window:64,32", "none", 520, 130, 64, 64, t, 128, 128, 1, 2, 2});
  }
  // Every score_mod in both dtypes on one mask with partial and full blocks.
  for (const char* score : scores)
    for (const DType t : {DType::kFloat16, DType::kBFloat16})
      cases.push_back({"prefix_lm:150", score, 333, 455, 128, 128, t, 128, 128, 1, 2, 1});
  // Key tiles of 64 (D = 256): blocks of 128 x 64 and 128 x 192, ragged tails.
  cases.push_back({"sliding_window:64,32", "softcap:2", 300, 1000, 256, 256, DType::kBFloat16, 128, 64, 1, 2, 2});
  cases.push_back({"mini_causal:64", "none", 257, 513, 256, 256, DType::kFloat16, 128, 192, 1, 2, 1});
  // Query blocks of three tiles, key blocks of three (kv subtiling, ragged last block).
  cases.push_back({"causal", "none", 700, 900, 64, 64, DType::kFloat16, 384, 384, 1, 2, 2});
  cases.push_back({"document", "rel_bias", 700, 700, 192, 128, DType::kBFloat16, 256, 384, 2, 2, 1});
  // One list per query block for every batch and head.
  cases.push_back({"causal", "none", 300, 1000, 64, 64, DType::kFloat16, 128, 128, 2, 2, 1, true});
  cases.push_back({"block_diagonal:100", "alibi", 511, 511, 128, 128, DType::kBFloat16, 256, 256, 2, 2, 2, true});
  // Long walks: 16 key tiles per query tile, the ring's phases wrapping many times.
  cases.push_back({"none", "none", 256, 2048, 128, 128, DType::kBFloat16, 128, 128, 1, 2, 2});
  cases.push_back({"document", "none", 2048, 2048, 64, 64, DType::kFloat16, 128, 128, 1, 1, 1});
  // More query tiles than SMs: the persistent grid (D = 128, 256, 192/128, 128/64), its
  // items from the counter, some without a key tile (Nq > Nk under a window).
  cases.push_back({"document", "alibi", 600, 700, 128, 64, DType::kFloat16, 128, 128, 2, 16, 4});
  cases.push_back({"causal", "none", 1000, 1000, 128, 128, DType::kBFloat16, 128, 128, 1, 20, 4});
  cases.push_back({"sliding_window:64,32", "rel_bias", 1200, 300, 256, 256, DType::kBFloat16, 128, 128, 1, 16, 16});
  cases.push_back({"mini_causal:37", "softcap:30", 700, 500, 128, 128, DType::kFloat16, 256, 128, 1, 24, 8});
  cases.push_back({"causal", "alibi", 700, 600, 192, 128, DType::kBFloat16, 128, 128, 1, 24, 8});
  // D = 64: a block per item, with the workspace given.
  cases.push_back({"prefix_lm:150", "none", 700, 900, 64, 64, DType::kBFloat16, 128, 128, 1, 24, 8});
  // The mods that read tensors: a tensor mask_mod and a bias score_mod, full
  // ([B, H, Nq, Nk]) and broadcast, ragged (17, 113 x 203, 799 x 3: rows of
  // two words), Nq != Nk with rows that see no key, GQA and MQA, both dtypes.
  auto in_form = [](Case c, Form f) {
    c.form = f;
    return c;
  };
  cases.push_back({"tensor", "none", 113, 203, 128, 128, DType::kFloat16, 128, 128, 2, 2, 2});
  cases.push_back(in_form({"tensor", "bias", 17, 17, 64, 64, DType::kBFloat16, 128, 128, 1, 4, 2}, Form::kHeadsKeys));
  cases.push_back({"none", "bias", 300, 1000, 192, 128, DType::kBFloat16, 128, 256, 2, 2, 2});
  cases.push_back(
      in_form({"causal", "bias", 1000, 300, 128, 128, DType::kFloat16, 256, 256, 1, 4, 1}, Form::kHeadsKeys));
  cases.push_back(
      in_form({"tensor", "alibi", 799, 3, 256, 256, DType::kFloat16, 128, 64, 2, 2, 2}, Form::kBatchQueries));
  cases.push_back({"tensor", "bias", 700, 900, 64, 64, DType::kBFloat16, 128, 128, 1, 24, 8});
  // The check can fail: the kernel given another score_mod than the reference.
  Case wrong{"causal", "none", 300, 1000, 128, 128, DType::kBFloat16, 128, 128, 1, 2, 2};
  wrong.kernel_score = "alibi";
  cases.push_back(wrong);
  return cases;
}

// Block sizes that are not multiples of the tile, and p.causal, are refused
// with a reason, and blocksparse_fwd does not launch them.
void refusals() {
  struct Refused {
    int D, block_q, block_kv;
    bool causal;
  };
  for (const Refused& r : {Refused{128, 64, 128, false}, Refused{64, 128, 64, false}, Refused{256, 192, 64, false},
                           Refused{128, 128, 128, true}}) {
    AttnProblem p;
    p.B = 1, p.H = 1, p.Nq = 300, p.Nk = 300, p.D = r.D, p.Dv = r.D, p.causal = r.causal;
    BlockMaskView view;
    view.B = 1, view.H = 1, view.Nq = 300, view.Nk = 300, view.block_q = r.block_q, view.block_kv = r.block_kv;
    view.m_blocks = (300 + r.block_q - 1) / r.block_q, view.n_blocks = (300 + r.block_kv - 1) / r.block_kv;
    static int32_t dummy[1];
    view.kv_count = view.kv_index = view.full_count = view.full_index = dummy;
    const std::string why = blocksparse_fwd_unsupported(p, view);
    char what[128];
    std::snprintf(what, sizeof what, "D=%d blocks %dx%d%s must be refused", r.D, r.block_q, r.block_kv,
                  r.causal ? " with p.causal" : "");
    record(!why.empty() && why.find('\n') == std::string::npos, what);
    record(blocksparse_fwd(p, AttnBuffers{}, view, MaskMod{}, ScoreMod{}, nullptr) == cudaErrorInvalidValue,
           std::string(what) + " (blocksparse_fwd)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  args = parse_case_args(argc, argv);
  verbose = args.verbose;
  if (!have_gpu()) return kSkipped;
  if (const std::string why = hopper_tma_unsupported(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return kSkipped;
  }
  if (!run_cases(args, all_cases(), 20240807, run_case)) return 1;
  if (args.only.empty()) refusals();
  return finish();
}
