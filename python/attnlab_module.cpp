// attnlab's Python module (attnlab._C): the registered variants on torch tensors
// (forward and backward, for attnlab.forward and attnlab.attention:
// python/attnlab/attention.py), dynamic-mask attention's forward and
// backward (kernels/dmattn/dmattn.h) for attnlab.dynamic_mask_attention
// (python/attnlab/dynamic_mask.py), and block-sparse attention's block mask
// and forward (kernels/blocksparse/) for attnlab.create_block_mask,
// attnlab.BlockMask and attnlab.flex_attention (python/attnlab/blocksparse.py),
// and the variable-length forward (kernels/varlen/) for
// attnlab.varlen_attention (python/attnlab/varlen.py).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "blocksparse/block_mask.h"
#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/blocksparse_bwd.h"
#include "blocksparse/blocksparse_fwd.h"
#include "blocksparse/mods.h"
#include "dmattn/dmattn.h"
#include "host/launch.h"
#include "host/variant.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"
#include "varlen/paged_decode.h"
#include "varlen/varlen.h"

namespace {

namespace py = pybind11;

// Clean Python exceptions (ValueError, TypeError) with one-line messages; torch's
// own TORCH_CHECK would surface as RuntimeError with a C++ backtrace. Macros, so
// the message is only built when the check fails. Messages are plain string
// concatenation, never iostream formatting (c10::str): that segfaults in
// std::ostream inside this module on some images (with either pybind11 build).
// `where` names the Python function the user called.
#define ATTNLAB_RAISE_UNLESS(ok, error, where, message)             \
  do {                                                              \
    if (!(ok)) throw error(std::string(where) + ": " + (message)); \
  } while (0)
#define ATTNLAB_REQUIRE_VALUE(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, "attnlab.forward", message)
#define ATTNLAB_REQUIRE_TYPE(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::type_error, "attnlab.forward", message)
#define DMA_REQUIRE_VALUE(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, kDmaName, message)
#define DMA_REQUIRE_TYPE(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::type_error, kDmaName, message)
constexpr const char* kDmaName = "attnlab.dynamic_mask_attention";

// The kernels copy Q, K, V and dO in 16-byte pieces: a contiguous tensor that
// starts off a 16-byte boundary (a view at an odd offset into its storage) is
// copied to a fresh allocation first, so that every input works.
at::Tensor aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

// A kernel's workspace: `bytes` bytes on like's device (256-byte aligned, as
// the caching allocator's blocks are).
at::Tensor workspace_tensor(size_t bytes, const at::Tensor& like) {
  return at::empty({int64_t(bytes)}, like.options().dtype(at::kByte));
}

// What a dense or block-sparse backward launch reads and writes: Q, K, V, O
// and dO 16-byte aligned (aligned16), dQ, dK, dV allocated like Q, K, V, a
// workspace of `workspace_bytes` (none for 0), held here while `b` points at them.
struct GradLaunch {
  at::Tensor q, k, v, o, dout, dq, dk, dv, workspace;
  attnlab::AttnGradBuffers b;
};
GradLaunch grad_launch(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& o_in,
                       const at::Tensor& lse, const at::Tensor& dout_in, size_t workspace_bytes) {
  GradLaunch g;
  g.q = aligned16(q_in), g.k = aligned16(k_in), g.v = aligned16(v_in), g.o = aligned16(o_in);
  g.dout = aligned16(dout_in);
  g.dq = at::empty(g.q.sizes(), g.q.options());
  g.dk = at::empty(g.k.sizes(), g.k.options());
  g.dv = at::empty(g.v.sizes(), g.v.options());
  attnlab::AttnGradBuffers& b = g.b;
  b.q = g.q.data_ptr(), b.k = g.k.data_ptr(), b.v = g.v.data_ptr(), b.o = g.o.data_ptr();
  b.lse = lse.data_ptr<float>();
  b.dout = g.dout.data_ptr();
  b.dq = g.dq.data_ptr(), b.dk = g.dk.data_ptr(), b.dv = g.dv.data_ptr();
  if (workspace_bytes > 0) {
    g.workspace = workspace_tensor(workspace_bytes, g.q);
    b.workspace = g.workspace.data_ptr();
    b.workspace_bytes = workspace_bytes;
  }
  return g;
}

// What a failed launch says: the variant's own words, else the reason the
// launch recorded (a tensor map's rule, the step that failed), else CUDA's.
std::string failure_text(const std::function<std::string()>& last_error, cudaError_t err) {
  if (std::string own = last_error ? last_error() : std::string(); !own.empty()) return own;
  if (!attnlab::launch_detail().empty()) return attnlab::launch_detail();
  return cudaGetErrorString(err);
}

std::string str(at::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
std::string str(const at::Tensor& t) { return str(t.sizes()); }
std::string str(at::ScalarType t) { return c10::toString(t); }
std::string str(const c10::Device& d) { return d.str(); }

using attnlab::AttnBuffers;
using attnlab::AttnGradBuffers;
using attnlab::AttnProblem;
using attnlab::BwdVariant;
using attnlab::DType;
using attnlab::Variant;

// The names of every registered variant of V's direction, in ladder order.
template <typename V>
std::vector<std::string> names_of() {
  std::vector<std::string> names;
  for (const V& v : attnlab::registered_variants<V>()) names.push_back(v.name);
  return names;
}
std::vector<std::string> variant_names() { return names_of<Variant>(); }
std::vector<std::string> bwd_variant_names() { return names_of<BwdVariant>(); }

// The registered variant of V's direction named `name`, else ValueError:
// "<unknown> '<name>'; known: <names>".
template <typename V>
const V& find_or_raise(const std::string& name, const std::string& unknown) {
  if (const V* v = attnlab::find_variant<V>(name)) return *v;
  std::string known;
  for (const std::string& n : names_of<V>()) known += (known.empty() ? "" : ", ") + n;
  throw py::value_error(unknown + " '" + name +
                        "'; known: " + (known.empty() ? std::string("none is registered") : known));
}
const Variant& find_variant(const std::string& name) {
  return find_or_raise<Variant>(name, "attnlab.forward: unknown variant");
}
const BwdVariant& find_bwd_variant(const std::string& name) {
  return find_or_raise<BwdVariant>(name, "attnlab.backward: unknown backward variant");
}

// Hkv: the KV heads (0: = H).
AttnProblem make_problem(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D, int64_t Dv, bool bf16,
                         bool is_causal, std::optional<double> scale, int64_t Hkv = 0) {
  AttnProblem p;
  p.B = int(B);
  p.H = int(H);
  p.Hkv = int(Hkv);
  p.Nq = int(Nq);
  p.Nk = int(Nk);
  p.D = int(D);
  p.Dv = int(Dv);
  p.dtype = bf16 ? DType::kBFloat16 : DType::kFloat16;
  p.causal = is_causal;
  p.scale = scale ? float(*scale) : attnlab::default_scale(p.D);
  return p;
}

// q, k or v: on q's CUDA device, q's dtype (fp16/bf16), 4-D, contiguous.
void check_tensor(const at::Tensor& t, const std::string& name, const at::Tensor& q,
                  const char* where = "attnlab.forward") {
  ATTNLAB_RAISE_UNLESS(t.is_cuda(), py::value_error, where,
                       name + " must be a CUDA tensor, got one on " + str(t.device()));
  ATTNLAB_RAISE_UNLESS(t.device() == q.device(), py::value_error, where,
                       "q, k and v must be on one device (" + name + " is on " + str(t.device()) + ", q on " +
                           str(q.device()) + ")");
  ATTNLAB_RAISE_UNLESS(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, py::type_error, where,
                       name + " must be float16 or bfloat16, got " + str(t.scalar_type()));
  ATTNLAB_RAISE_UNLESS(t.scalar_type() == q.scalar_type(), py::type_error, where,
                       "q, k and v must share a dtype (" + name + " is " + str(t.scalar_type()) + ", q is " +
                           str(q.scalar_type()) + ")");
  ATTNLAB_RAISE_UNLESS(t.dim() == 4, py::value_error, where,
                       name + " must be 4-D [B, H, N, D], got shape " + str(t.sizes()));
  ATTNLAB_RAISE_UNLESS(t.is_contiguous(), py::value_error, where,
                       name + " must be contiguous in [B, H, N, D] layout (call .contiguous()); got strides " +
                           str(t.strides()));
}

// q, k, v checked and described as a problem; `where` names the Python
// function for the messages. enable_gqa as in torch's
// scaled_dot_product_attention: without it k and v have q's heads; with it
// any Hkv that divides them (query head h reads KV head h / (H / Hkv)).
AttnProblem checked_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                            std::optional<double> scale, bool enable_gqa, const char* where) {
#define REQUIRE_AT(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, where, message)
  check_tensor(q, "q", q, where);
  check_tensor(k, "k", q, where);
  check_tensor(v, "v", q, where);
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2), Dv = v.size(3);
  const int64_t Hkv = k.size(1);
  const std::string shapes = str(q.sizes()) + ", " + str(k.sizes()) + ", " + str(v.sizes());
  REQUIRE_AT(k.size(0) == B && v.size(0) == B, "q, k, v must share B; got " + shapes);
  REQUIRE_AT(v.size(1) == Hkv, "k and v must have the same number of heads; got " + shapes);
  REQUIRE_AT(enable_gqa || Hkv == H,
             "k and v must have q's number of heads (" + std::to_string(H) + ") unless enable_gqa=True; got " + shapes);
  REQUIRE_AT(Hkv >= 1 && H % Hkv == 0, "q's heads (" + std::to_string(H) + ") must be a multiple of k's and v's (" +
                                           std::to_string(Hkv) + "); got " + shapes);
  REQUIRE_AT(k.size(3) == D,
             "k's head dim must equal q's (" + std::to_string(k.size(3)) + " vs " + std::to_string(D) + ")");
  REQUIRE_AT(v.size(2) == Nk,
             "v must have as many rows as k (" + std::to_string(v.size(2)) + " vs " + std::to_string(Nk) + ")");
  REQUIRE_AT(B >= 1 && H >= 1 && Nq >= 1 && Nk >= 1 && D >= 1 && Dv >= 1,
             "every dimension must be at least 1; got " + shapes);
  REQUIRE_AT(B <= 65535 && H <= 65535 && Nq < (int64_t(1) << 31) && Nk < (int64_t(1) << 31),
             "shape too large: B and H must be <= 65535 and N < 2^31");
  REQUIRE_AT(!scale || (std::isfinite(*scale) && *scale > 0), "scale must be positive");
#undef REQUIRE_AT
  return make_problem(B, H, Nq, Nk, D, Dv, q.scalar_type() == at::kBFloat16, is_causal, scale, Hkv);
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                           const std::string& variant, bool is_causal, std::optional<double> scale,
                                           bool enable_gqa) {
  const AttnProblem p = checked_problem(q_in, k_in, v_in, is_causal, scale, enable_gqa, "attnlab.forward");
  const int64_t B = p.B, H = p.H, Nq = p.Nq, Dv = p.Dv;
  const c10::cuda::CUDAGuard guard(q_in.device());
  const Variant& var = find_variant(variant);
  const std::string why = var.unsupported_reason(p);
  ATTNLAB_REQUIRE_VALUE(why.empty(), "variant '" + variant + "' does not support " + p.shape_string() + ": " + why);
  const at::Tensor q = aligned16(q_in), k = aligned16(k_in), v = aligned16(v_in);
  at::Tensor o = at::empty({B, H, Nq, Dv}, q.options());
  at::Tensor lse = at::empty({B, H, Nq}, q.options().dtype(at::kFloat));
  at::Tensor workspace;
  AttnBuffers b;
  b.q = q.data_ptr();
  b.k = k.data_ptr();
  b.v = v.data_ptr();
  b.o = o.data_ptr();
  b.lse = lse.data_ptr<float>();
  if (const size_t bytes = var.workspace_bytes(p); bytes > 0) {
    workspace = at::empty({int64_t(bytes)}, q.options().dtype(at::kByte));
    b.workspace = workspace.data_ptr();
    b.workspace_bytes = bytes;
  }
  attnlab::launch_detail().clear();
  const cudaError_t err = var.launch(p, b, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error("attnlab.forward: " + variant + " failed: " + failure_text(var.last_error, err));
  return {o, lse};
}

// ---- the backward (for attnlab.attention) ---------------------------------------------
#define ATTNLAB_BWD_REQUIRE_VALUE(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, "attnlab.backward", message)

bool bwd_deterministic(const std::string& name) { return find_bwd_variant(name).deterministic; }

// dQ, dK, dV (q's, k's and v's shapes and dtype) of L = Σ o ⊙ dout, from the
// forward's o [B,H,Nq,Dv] and lse [B,H,Nq] (fp32), with one backward variant.
// A backward's o, lse and dout beside q (of problem p): ValueError with one line
// when one is not on q's device, of q's dtype (lse: float32) and shape, contiguous.
void check_backward_inputs(const AttnProblem& p, const at::Tensor& q, const at::Tensor& o, const at::Tensor& lse,
                           const at::Tensor& dout, const char* where) {
  const std::vector<int64_t> o_shape = {p.B, p.H, p.Nq, p.Dv};
  for (const auto& [t, name] : {std::pair{&o, "o"}, std::pair{&dout, "dout"}})
    ATTNLAB_RAISE_UNLESS(t->is_cuda() && t->device() == q.device() && t->scalar_type() == q.scalar_type() &&
                             t->sizes() == at::IntArrayRef(o_shape) && t->is_contiguous(),
                         py::value_error, where,
                         std::string(name) + " must be a contiguous " + str(q.scalar_type()) + " tensor " +
                             str(at::IntArrayRef(o_shape)) + " on " + str(q.device()) + "; got " +
                             str(t->scalar_type()) + " " + str(*t) + " on " + str(t->device()));
  ATTNLAB_RAISE_UNLESS(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                           lse.sizes() == q.sizes().slice(0, 3) && lse.is_contiguous(),
                       py::value_error, where,
                       "lse must be a contiguous float32 tensor [B, H, Nq] on q's device; got " +
                           str(lse.scalar_type()) + " " + str(lse));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& q_in, const at::Tensor& k_in,
                                                        const at::Tensor& v_in, const at::Tensor& o_in,
                                                        const at::Tensor& lse, const at::Tensor& dout_in,
                                                        const std::string& variant, bool is_causal,
                                                        std::optional<double> scale, bool enable_gqa) {
  const AttnProblem p = checked_problem(q_in, k_in, v_in, is_causal, scale, enable_gqa, "attnlab.backward");
  check_backward_inputs(p, q_in, o_in, lse, dout_in, "attnlab.backward");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const BwdVariant& var = find_bwd_variant(variant);
  const std::string why = var.unsupported_reason(p);
  ATTNLAB_BWD_REQUIRE_VALUE(why.empty(),
                            "variant '" + variant + "' does not support " + p.shape_string() + ": " + why);
  const GradLaunch g = grad_launch(q_in, k_in, v_in, o_in, lse, dout_in, var.workspace_bytes(p));
  attnlab::launch_detail().clear();
  const cudaError_t err = var.launch(p, g.b, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error("attnlab.backward: " + variant + " failed: " + failure_text(var.last_error, err));
  return {g.dq, g.dk, g.dv};
}

// Why a backward variant cannot run this problem ("" when it can); Hkv: the KV heads (0: = H).
std::string bwd_unsupported_reason(const std::string& variant, int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                                   int64_t D, int64_t Dv, bool bf16, bool is_causal, int64_t Hkv) {
  return find_bwd_variant(variant).unsupported_reason(
      make_problem(B, H, Nq, Nk, D, Dv, bf16, is_causal, std::nullopt, Hkv));
}

// Why the block-sparse backward cannot take this problem whatever its block
// mask ("" when it can): dmattn's backward chooses with it.
std::string bs_bwd_unsupported_reason(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D, int64_t Dv, bool bf16,
                                      int64_t Hkv) {
  return attnlab::blocksparse_bwd_problem_unsupported(
      make_problem(B, H, Nq, Nk, D, Dv, bf16, false, std::nullopt, Hkv));
}

// Why `variant` cannot run this problem ("" when it can), for tests to skip.
// Hkv: the KV heads (0: = H).
std::string unsupported_reason(const std::string& variant, int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D,
                               int64_t Dv, bool bf16, bool is_causal, int64_t Hkv) {
  return find_variant(variant).unsupported_reason(
      make_problem(B, H, Nq, Nk, D, Dv, bf16, is_causal, std::nullopt, Hkv));
}

// The project's one check rule (reference/reference.h), for the Python tests.
std::tuple<bool, double> judge(double err, int64_t nonfinite, double lse_err, int64_t lse_nonfinite,
                               double baseline_err, double rounding_err) {
  attnlab::ErrorStats out, lse;
  out.max_abs_err = err;
  out.nonfinite = nonfinite;
  lse.max_abs_err = lse_err;
  lse.nonfinite = lse_nonfinite;
  const attnlab::CheckResult r = attnlab::judge(out, lse, baseline_err, rounding_err);
  return {r.pass, r.tol};
}

// ---- dynamic-mask attention (kernels/dmattn/dmattn.h) ------------------------------
using attnlab::BroadcastOperand;
using attnlab::DynamicMaskProblem;

// "({2|1}, {8|2|1}, {17|1}, 130)": the shapes a mask or bias may have.
std::string broadcast_rule(const DynamicMaskProblem& p) {
  const std::string h = p.Hkv == p.H ? std::to_string(p.H) + "|1" : std::to_string(p.H) + "|" + std::to_string(p.Hkv) + "|1";
  return "({" + std::to_string(p.B) + "|1}, {" + h + "}, {" + std::to_string(p.Nq) + "|1}, " + std::to_string(p.Nk) +
         ")";
}

// A mask (bool/uint8) or bias (q's dtype) of shape ({B|1}, {H|Hkv|1}, {Nq|1}, Nk),
// dense in that shape; sets `operand` to read it through broadcast strides.
// An int32 mask is attnlab.PackedMask's words (DmaMaskFormat::kBits, rows of
// dma_mask_bit_row_words(Nk) words; python/attnlab/dynamic_mask.py passes no
// other int32 mask): the caller sets the problem's mask_format.
void bind_operand(const std::optional<at::Tensor>& t, const std::string& name, bool is_mask, const at::Tensor& q,
                  const DynamicMaskProblem& p, BroadcastOperand& operand) {
  if (!t) return;
  DMA_REQUIRE_VALUE(t->is_cuda() && t->device() == q.device(),
                    name + " must be on q's device (" + str(q.device()) + "), got one on " + str(t->device()));
  const bool bits = is_mask && t->scalar_type() == at::kInt;
  if (is_mask)
    DMA_REQUIRE_TYPE(t->scalar_type() == at::kBool || t->scalar_type() == at::kByte || bits,
                     "mask must be bool or uint8 (0 = masked), got " + str(t->scalar_type()));
  else
    DMA_REQUIRE_TYPE(t->scalar_type() == q.scalar_type(),
                     "bias must have q's dtype (" + str(q.scalar_type()) + "), got " + str(t->scalar_type()));
  const int64_t row = bits ? attnlab::dma_mask_bit_row_words(p.Nk) : p.Nk;  // elements per row
  const bool shape_ok = t->dim() == 4 && (t->size(0) == 1 || t->size(0) == p.B) &&
                        (t->size(1) == 1 || t->size(1) == p.H || t->size(1) == p.Hkv) &&
                        (t->size(2) == 1 || t->size(2) == p.Nq) && t->size(3) == row;
  DMA_REQUIRE_VALUE(shape_ok, name + (bits ? " (packed, " + std::to_string(row) + " words per row)" : "") +
                                  " must have shape " + broadcast_rule(p) + ", got " + str(t->sizes()));
  DMA_REQUIRE_VALUE(t->is_contiguous(), name + " must be contiguous in its shape (call .contiguous()); got strides " +
                                            str(t->strides()));
  operand.data = t->data_ptr();
  operand.set_shape(int(t->size(0)), int(t->size(1)), int(t->size(2)), int(row), p.H);
}

// Checks q, k, v, mask and bias and describes them as a problem; raises
// ValueError/TypeError with one line on anything the kernels do not take.
DynamicMaskProblem make_dma_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& bias,
                                    bool is_causal, std::optional<double> scale, std::optional<double> softcap) {
  check_tensor(q, "q", q, kDmaName);
  check_tensor(k, "k", q, kDmaName);
  check_tensor(v, "v", q, kDmaName);
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Hkv = k.size(1), Nk = k.size(2);
  const std::string shapes = "q " + str(q.sizes()) + ", k " + str(k.sizes()) + ", v " + str(v.sizes());
  DMA_REQUIRE_VALUE(k.size(0) == B && v.size(0) == B, "q, k and v must share B; got " + shapes);
  DMA_REQUIRE_VALUE(v.size(1) == Hkv && v.size(2) == Nk, "k and v must share Hkv and Nk; got " + shapes);
  DMA_REQUIRE_VALUE(k.size(3) == D && v.size(3) == D, "k and v must have q's head dim; got " + shapes);
  DMA_REQUIRE_VALUE(B >= 1 && H >= 1 && Hkv >= 1 && Nq >= 1 && Nk >= 1 && D >= 1,
                    "every dimension must be at least 1; got " + shapes);
  DMA_REQUIRE_VALUE(H % Hkv == 0, "q's heads (" + std::to_string(H) + ") must be a multiple of k's and v's (" +
                                      std::to_string(Hkv) + "); got " + shapes);
  DMA_REQUIRE_VALUE(B <= 65535 && H <= 65535 && Nq < (int64_t(1) << 31) && Nk < (int64_t(1) << 31),
                    "shape too large: B and H must be <= 65535 and N < 2^31; got " + shapes);
  DMA_REQUIRE_VALUE(!scale || (std::isfinite(*scale) && *scale > 0), "scale must be positive and finite");
  DMA_REQUIRE_VALUE(!softcap || (std::isfinite(*softcap) && *softcap >= 0),
                    "softcap must be >= 0 and finite (0 or None: off)");
  DynamicMaskProblem p;
  p.B = int(B);
  p.H = int(H);
  p.Hkv = int(Hkv);
  p.Nq = int(Nq);
  p.Nk = int(Nk);
  p.D = int(D);
  p.dtype = q.scalar_type() == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
  p.causal = is_causal;
  p.scale = scale ? float(*scale) : attnlab::default_scale(p.D);
  p.softcap = softcap ? float(*softcap) : 0.f;
  bind_operand(mask, "mask", true, q, p, p.mask);
  bind_operand(bias, "bias", false, q, p, p.bias);
  if (mask && mask->scalar_type() == at::kInt) p.mask_format = attnlab::DmaMaskFormat::kBits;
  return p;
}

// attnlab.pack_mask: a 4-D bool/uint8 mask (b, h, q, Nk), contiguous, as its
// bit-packed words (dma_pack_mask_bits): int32 (b, h, q, 2·ceil(Nk / 64)).
at::Tensor dma_pack_mask_bits(const at::Tensor& mask) {
  DMA_REQUIRE_VALUE(mask.is_cuda(), "mask must be a CUDA tensor, got one on " + str(mask.device()));
  DMA_REQUIRE_TYPE(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte,
                   "mask must be bool or uint8 (0 = masked), got " + str(mask.scalar_type()));
  DMA_REQUIRE_VALUE(mask.dim() == 4 && mask.is_contiguous() && mask.numel() > 0,
                    "mask must be a contiguous, non-empty 4-D tensor, got " + str(mask.sizes()));
  DMA_REQUIRE_VALUE(mask.size(0) <= 65535 && mask.size(1) <= 65535 && mask.size(2) < (int64_t(1) << 31) &&
                        mask.size(3) < (int64_t(1) << 31),
                    "mask too large: " + str(mask.sizes()));
  DynamicMaskProblem p;  // the mask's own shape as the problem's (every dim "full")
  p.B = int(mask.size(0));
  p.H = p.Hkv = int(mask.size(1));
  p.Nq = int(mask.size(2));
  p.Nk = int(mask.size(3));
  p.mask.data = mask.data_ptr();
  p.mask.set_shape(p.B, p.H, p.Nq, p.Nk, p.H);
  const c10::cuda::CUDAGuard guard(mask.device());
  at::Tensor out = at::empty({mask.size(0), mask.size(1), mask.size(2), attnlab::dma_mask_bit_row_words(p.Nk)},
                             mask.options().dtype(at::kInt));
  attnlab::launch_detail().clear();
  const cudaError_t err =
      attnlab::dma_pack_mask_bits(p, static_cast<uint32_t*>(out.data_ptr()), at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("attnlab.pack_mask: packing ") + str(mask.sizes()) +
                             " failed: " + failure_text(nullptr, err));
  return out;
}

// O [B,H,Nq,D] in q's dtype, LSE [B,H,Nq] fp32, and — with `check_backward`,
// where the forward ran a mask pre-pass — its workspace, whose first bytes are
// the mask summary the backward can reuse (else None). With `check_backward`,
// also raises when the backward could not run this problem (before any work).
std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> dma_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const std::optional<at::Tensor>& mask,
                                               const std::optional<at::Tensor>& bias, bool is_causal,
                                               std::optional<double> scale, std::optional<double> softcap,
                                               bool check_backward, const std::optional<at::Tensor>& mask_summary) {
  const DynamicMaskProblem p = make_dma_problem(q, k, v, mask, bias, is_causal, scale, softcap);
  const c10::cuda::CUDAGuard guard(q.device());
  const std::string why = attnlab::dma_forward_unsupported(p);
  DMA_REQUIRE_VALUE(why.empty(), "does not support " + p.shape_string() + ": " + why);
  if (check_backward) {
    const std::string why_bwd = attnlab::dma_backward_unsupported(p);
    DMA_REQUIRE_VALUE(why_bwd.empty(), "no gradient for " + p.shape_string() + " (" + why_bwd +
                                           "); run it under torch.no_grad() or without inputs that require grad");
  }
  at::Tensor o = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({p.B, p.H, p.Nq}, q.options().dtype(at::kFloat));
  attnlab::DmaForwardArgs a;
  const at::Tensor q16 = aligned16(q), k16 = aligned16(k), v16 = aligned16(v);
  a.q = q16.data_ptr();
  a.k = k16.data_ptr();
  a.v = v16.data_ptr();
  a.o = o.data_ptr();
  a.lse = lse.data_ptr<float>();
  a.splits = attnlab::dma_resolve_splits(p, 0);
  at::Tensor workspace;
  if (const size_t bytes = attnlab::dma_forward_workspace_bytes(p, a.splits); bytes > 0) {
    workspace = workspace_tensor(bytes, q);
    a.workspace = static_cast<float*>(workspace.data_ptr());
    a.workspace_bytes = bytes;
  }
  const bool given = mask_summary.has_value() && mask.has_value();
  if (given) {  // dma_build_mask_summary's output for this same mask and shape (attnlab.build_mask_summary checks)
    DMA_REQUIRE_VALUE(mask_summary->is_cuda() && mask_summary->device() == q.device() &&
                          mask_summary->scalar_type() == at::kByte && mask_summary->is_contiguous() &&
                          size_t(mask_summary->numel()) >= attnlab::dma_mask_summary_bytes(p),
                      "mask_summary must be attnlab.build_mask_summary's for the same inputs");
    a.mask_summary = static_cast<const uint32_t*>(mask_summary->data_ptr());
  }
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::dma_forward(p, a, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(kDmaName) + ": forward of " + p.shape_string() +
                             " failed: " + failure_text(nullptr, err));
  std::optional<at::Tensor> summary;
  if (check_backward && attnlab::dma_forward_mask_summary(p, a) != nullptr) summary = given ? *mask_summary : workspace;
  return {o, lse, summary};
}

// The mask's tile summary (dma_build_mask_summary) as a uint8 tensor, for
// dma_forward's mask_summary: depends on the mask and on q's and k's shapes
// and is_causal, not on the values of q, k, v or the bias.
at::Tensor dma_build_mask_summary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& mask, bool is_causal) {
  const DynamicMaskProblem p = make_dma_problem(q, k, v, mask, std::nullopt, is_causal, std::nullopt, std::nullopt);
  const c10::cuda::CUDAGuard guard(q.device());
  // Sized as dma_forward's workspace for one split, whose first bytes are the
  // summary: so that dma_backward takes it as it takes that workspace.
  at::Tensor out = workspace_tensor(std::max<size_t>(attnlab::dma_forward_workspace_bytes(p, 1), 16), q);
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::dma_build_mask_summary(p, static_cast<uint32_t*>(out.data_ptr()),
                                                          at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(kDmaName) + ": mask summary of " + p.shape_string() +
                             " failed: " + failure_text(nullptr, err));
  return out;
}

// dQ, dK, dV (the input dtype) and, with `need_dbias`, dBias in the bias's own
// shape (summed over its broadcast dims; else None). The mask gets no gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>> dma_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
    const at::Tensor& dout, const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& bias,
    bool is_causal, std::optional<double> scale, std::optional<double> softcap, bool need_dbias, bool deterministic,
    const std::optional<at::Tensor>& mask_summary) {
  const DynamicMaskProblem p = make_dma_problem(q, k, v, mask, bias, is_causal, scale, softcap);
  const auto check_like_q = [&](const at::Tensor& t, const std::string& name) {
    DMA_REQUIRE_VALUE(t.is_cuda() && t.device() == q.device() && t.scalar_type() == q.scalar_type() &&
                          t.sizes() == q.sizes() && t.is_contiguous(),
                      name + " must be a contiguous " + str(q.scalar_type()) + " tensor of q's shape " +
                          str(q.sizes()) + " on " + str(q.device()) + "; got " + str(t.scalar_type()) + " " +
                          str(t.sizes()) + " on " + str(t.device()));
  };
  check_like_q(o, "out");
  check_like_q(dout, "grad_out");
  DMA_REQUIRE_VALUE(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                        lse.sizes() == q.sizes().slice(0, 3) && lse.is_contiguous(),
                    "lse must be a contiguous float32 tensor [B, H, Nq] on q's device; got " +
                        str(lse.scalar_type()) + " " + str(lse.sizes()));
  DMA_REQUIRE_VALUE(!need_dbias || bias, "need_dbias without a bias");
  const c10::cuda::CUDAGuard guard(q.device());
  const std::string why = attnlab::dma_backward_unsupported(p);
  DMA_REQUIRE_VALUE(why.empty(), "no gradient for " + p.shape_string() + ": " + why);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  std::optional<at::Tensor> dbias;
  if (need_dbias) dbias = at::empty(bias->sizes(), bias->options());
  attnlab::DmaBackwardArgs a;
  const at::Tensor q16 = aligned16(q), k16 = aligned16(k), v16 = aligned16(v);
  a.q = q16.data_ptr();
  a.k = k16.data_ptr();
  a.v = v16.data_ptr();
  a.o = o.data_ptr();
  a.lse = lse.data_ptr<float>();
  const at::Tensor dout16 = aligned16(dout);
  a.dout = dout16.data_ptr();
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dbias = dbias ? dbias->data_ptr() : nullptr;
  a.deterministic = deterministic;
  a.q_chunks = 0;  // automatic (the same count below and in dma_backward)
  if (mask_summary && mask) {  // dma_forward's third output for these same tensors
    DMA_REQUIRE_VALUE(mask_summary->is_cuda() && mask_summary->device() == q.device() &&
                          mask_summary->scalar_type() == at::kByte && mask_summary->is_contiguous() &&
                          size_t(mask_summary->numel()) >= attnlab::dma_forward_workspace_bytes(p, 1),
                      "mask_summary must be dma_forward's third output for the same inputs");
    a.mask_summary = static_cast<const uint32_t*>(mask_summary->data_ptr());
  }
  at::Tensor workspace;
  if (const size_t bytes = attnlab::dma_backward_workspace_bytes(p, deterministic, a.q_chunks); bytes > 0) {
    workspace = workspace_tensor(bytes, q);
    a.workspace = static_cast<float*>(workspace.data_ptr());
    a.workspace_bytes = bytes;
  }
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::dma_backward(p, a, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(kDmaName) + ": backward of " + p.shape_string() +
                             " failed: " + failure_text(nullptr, err));
  return {dq, dk, dv, dbias};
}

// ---- block-sparse attention (kernels/blocksparse/) -----------------------------------
// A block mask crosses the binding as the 8 int32 tensors of torch's BlockMask,
// in its order and with its names (block_mask.h's lists):
//   kv_num_blocks [B, H, M], kv_indices [B, H, M, N]        the partial key blocks of each query block
//   full_kv_num_blocks, full_kv_indices                     the full ones
//   q_num_blocks [B, H, N], q_indices [B, H, N, M]          the transpose (the backward's)
//   full_q_num_blocks, full_q_indices
// M = ceil(Nq / block_q), N = ceil(Nk / block_kv); B and H the problem's or 1.
constexpr const char* kBlockMaskNames[8] = {"kv_num_blocks",  "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                                            "q_num_blocks",   "q_indices",  "full_q_num_blocks",  "full_q_indices"};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A contiguous [1|B, 1|Hkv|H, 1|Nq, row] tensor as the kernels read it for H
// query heads (BroadcastOperand::set_shape: stride 0 along a dimension of
// size 1; Hkv heads each read by its group of H / Hkv query heads).
BroadcastOperand pair_tensor(const at::Tensor& t, const void* data, int64_t H) {
  BroadcastOperand operand;
  operand.data = data;
  operand.set_shape(int(t.size(0)), int(t.size(1)), int(t.size(2)), int(t.size(3)), int(H));
  return operand;
}

// Why a tensor operand of the pairs is not [1|B, 1|H, 1|Nq, cols] (contiguous,
// `dtype`, on `device`; also Hkv heads where Hkv > 0, each read by its group
// of query heads); "" when it is.
std::string pair_tensor_unfit(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t B, int64_t H,
                              int64_t Nq, int64_t cols, const c10::Device& device, int64_t Hkv = 0) {
  const bool kv = Hkv > 1 && Hkv < H;
  const std::string want = "[1|" + std::to_string(B) + ", 1|" + (kv ? std::to_string(Hkv) + "|" : "") +
                           std::to_string(H) + ", 1|" + std::to_string(Nq) + ", " + std::to_string(cols) + "]";
  if (!t.is_cuda() || t.device() != device)
    return std::string(name) + " must be on " + str(device) + ", got one on " + str(t.device());
  if (t.scalar_type() != dtype) return std::string(name) + " must be " + str(dtype) + ", got " + str(t.scalar_type());
  const bool heads_fit = t.dim() == 4 && (t.size(1) == 1 || t.size(1) == H || (kv && t.size(1) == Hkv));
  const bool fits = heads_fit && (t.size(0) == 1 || t.size(0) == B) && (t.size(2) == 1 || t.size(2) == Nq) &&
                    t.size(3) == cols && t.is_contiguous();
  return fits ? "" : std::string(name) + " must be a contiguous " + want + " tensor, got " + str(t.sizes());
}

// The mask_mod of `spec` for Nq x Nk; a document mask_mod reads `doc_ids`
// (int32 [rows, L], L >= max(Nq, Nk), on `device`), one row per batch the
// caller evaluates it for; a tensor mask_mod `mask_bits`, bit-packed int32
// [1|rows, 1|heads, 1|Nq, 2·ceil(Nk / 64)] (attnlab.pack_mask's words).
attnlab::MaskMod checked_mask_mod(const std::string& spec, int64_t Nq, int64_t Nk,
                                  const std::optional<at::Tensor>& doc_ids, int64_t rows, const c10::Device& device,
                                  const char* where, const std::optional<at::Tensor>& mask_bits = std::nullopt,
                                  int64_t heads = 1) {
  std::string why;
  attnlab::MaskMod mask = attnlab::parse_mask_mod(spec, int(Nq), int(Nk), why);
  ATTNLAB_RAISE_UNLESS(why.empty(), py::value_error, where, why);
  ATTNLAB_RAISE_UNLESS(mask.kind == attnlab::MaskModKind::kTensor || !mask_bits, py::value_error, where,
                       "mask_bits are the tensor mask_mod's; mask_mod is '" + spec + "'");
  if (mask.kind == attnlab::MaskModKind::kTensor) {
    ATTNLAB_RAISE_UNLESS(!doc_ids, py::value_error, where, "doc_ids are the document mask_mod's; mask_mod is 'tensor'");
    ATTNLAB_RAISE_UNLESS(mask_bits.has_value(), py::value_error, where,
                         "the tensor mask_mod is a keep tensor: pass the tensor itself as mask_mod");
    const std::string unfit = pair_tensor_unfit(*mask_bits, "mask_bits", at::kInt, rows, heads, Nq,
                                                attnlab::dma_mask_bit_row_words(int(Nk)), device);
    ATTNLAB_RAISE_UNLESS(unfit.empty(), py::value_error, where, unfit);
    mask.bits = pair_tensor(*mask_bits, mask_bits->data_ptr(), mask_bits->size(1));
    return mask;
  }
  if (mask.kind != attnlab::MaskModKind::kDocument) {
    ATTNLAB_RAISE_UNLESS(!doc_ids, py::value_error, where,
                         "doc_ids are the document mask_mod's; mask_mod is '" + spec + "'");
    return mask;
  }
  ATTNLAB_RAISE_UNLESS(doc_ids.has_value(), py::value_error, where,
                       "the document mask_mod needs doc_ids (int32 [B, N], N >= max(Q_LEN, KV_LEN))");
  const at::Tensor& ids = *doc_ids;
  const int64_t L = std::max(Nq, Nk);
  ATTNLAB_RAISE_UNLESS(ids.is_cuda() && ids.device() == device, py::value_error, where,
                       "doc_ids must be on " + str(device) + ", got one on " + str(ids.device()));
  ATTNLAB_RAISE_UNLESS(ids.scalar_type() == at::kInt, py::type_error, where,
                       "doc_ids must be int32, got " + str(ids.scalar_type()));
  ATTNLAB_RAISE_UNLESS(ids.dim() == 2 && ids.size(0) == rows && ids.size(1) >= L && ids.is_contiguous(),
                       py::value_error, where,
                       "doc_ids must be a contiguous [" + std::to_string(rows) + ", >= " + std::to_string(L) +
                           "] tensor, got " + str(ids));
  mask.doc = ids.data_ptr<int32_t>();
  mask.doc_len = int(ids.size(1));
  return mask;
}

attnlab::ScoreMod checked_score_mod(const std::string& spec, int64_t H, const char* where) {
  std::string why;
  const attnlab::ScoreMod score = attnlab::parse_score_mod(spec, int(H), why);
  ATTNLAB_RAISE_UNLESS(why.empty(), py::value_error, where, why);
  return score;
}

// The score_mod of `spec` for the problem p; a bias score_mod reads `bias`
// ([1|B, 1|H, 1|Nq, Nk], q's dtype) and, given `dbias` (fp32, zeroed, in the
// bias's shape or the full [B, H, Nq, Nk]), writes its gradient there.
attnlab::ScoreMod checked_score_mod(const std::string& spec, const AttnProblem& p, const at::Tensor& q,
                                    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& dbias,
                                    const char* where) {
  attnlab::ScoreMod score = checked_score_mod(spec, p.H, where);
  if (score.kind != attnlab::ScoreModKind::kBias) {
    ATTNLAB_RAISE_UNLESS(!bias && !dbias, py::value_error, where,
                         "bias is the bias score_mod's; score_mod is '" + spec + "'");
    return score;
  }
  ATTNLAB_RAISE_UNLESS(bias.has_value(), py::value_error, where, "the bias score_mod needs its tensor");
  std::string unfit = pair_tensor_unfit(*bias, "bias", q.scalar_type(), p.B, p.H, p.Nq, p.Nk, q.device(), p.Hkv);
  ATTNLAB_RAISE_UNLESS(unfit.empty(), py::value_error, where, unfit);
  score.bias = pair_tensor(*bias, bias->data_ptr(), p.H);
  score.bias_bf16 = q.scalar_type() == at::kBFloat16;
  score.nq = p.Nq, score.nk = p.Nk;
  if (dbias) {
    unfit = pair_tensor_unfit(*dbias, "dbias", at::kFloat, p.B, p.H, p.Nq, p.Nk, q.device(), p.Hkv);
    ATTNLAB_RAISE_UNLESS(unfit.empty(), py::value_error, where, unfit);
    score.dbias = dbias->data_ptr<float>();
    score.dbias_at = pair_tensor(*dbias, nullptr, p.H);
    // added where several pairs share an element (a broadcast dimension, or
    // the query heads of one KV head's group)
    score.dbias_add = (dbias->size(0) == 1 && p.B > 1) || (dbias->size(1) < p.H && p.H > 1) ||
                      (dbias->size(2) == 1 && p.Nq > 1);
  }
  return score;
}

// The canonical forms of the specs ("sliding_window:128,0"), or ValueError with one line.
std::string bs_parse_mask_mod(const std::string& spec, int64_t Nq, int64_t Nk) {
  std::string why;
  const attnlab::MaskMod mask = attnlab::parse_mask_mod(spec, int(Nq), int(Nk), why);
  ATTNLAB_RAISE_UNLESS(why.empty(), py::value_error, "attnlab", why);
  return attnlab::mask_mod_name(mask);
}
std::string bs_parse_score_mod(const std::string& spec, int64_t H) {
  return attnlab::score_mod_name(checked_score_mod(spec, H, "attnlab"));
}

// The view of the 8 tensors (or the first 4: the forward's), after checking
// their dtype, device, layout and shapes; B and H from kv_num_blocks.
attnlab::BlockMaskView checked_block_mask(const std::vector<at::Tensor>& t, int64_t Nq, int64_t Nk, int64_t block_q,
                                          int64_t block_kv, const c10::Device& device, const char* where) {
  ATTNLAB_RAISE_UNLESS(t.size() == 4 || t.size() == 8, py::value_error, where, "a block mask is 4 or 8 tensors");
  ATTNLAB_RAISE_UNLESS(block_q >= 1 && block_kv >= 1 && Nq >= 1 && Nk >= 1, py::value_error, where,
                       "block sizes and lengths must be >= 1");
  ATTNLAB_RAISE_UNLESS(t[0].dim() == 3, py::value_error, where,
                       "kv_num_blocks must be [B, H, M], got " + str(t[0]));
  const int64_t B = t[0].size(0), H = t[0].size(1), M = ceil_div(Nq, block_q), N = ceil_div(Nk, block_kv);
  for (size_t i = 0; i < t.size(); ++i) {
    const bool counts = i % 2 == 0, forward = i < 4;
    const std::vector<int64_t> want = counts ? std::vector<int64_t>{B, H, forward ? M : N}
                                             : std::vector<int64_t>{B, H, forward ? M : N, forward ? N : M};
    ATTNLAB_RAISE_UNLESS(t[i].is_cuda() && t[i].device() == device, py::value_error, where,
                         std::string(kBlockMaskNames[i]) + " must be on " + str(device) + ", got one on " +
                             str(t[i].device()));
    ATTNLAB_RAISE_UNLESS(t[i].scalar_type() == at::kInt, py::type_error, where,
                         std::string(kBlockMaskNames[i]) + " must be int32, got " + str(t[i].scalar_type()));
    ATTNLAB_RAISE_UNLESS(t[i].sizes() == at::IntArrayRef(want) && t[i].is_contiguous(), py::value_error, where,
                         std::string(kBlockMaskNames[i]) + " must be a contiguous " + str(at::IntArrayRef(want)) +
                             " tensor for Q_LEN=" + std::to_string(Nq) + ", KV_LEN=" + std::to_string(Nk) +
                             " and BLOCK_SIZE=(" + std::to_string(block_q) + ", " + std::to_string(block_kv) +
                             "), got " + str(t[i]));
  }
  attnlab::BlockMaskView v;
  v.B = int(B), v.H = int(H), v.Nq = int(Nq), v.Nk = int(Nk), v.block_q = int(block_q), v.block_kv = int(block_kv);
  v.m_blocks = int(M), v.n_blocks = int(N);
  int32_t* p[8] = {};
  for (size_t i = 0; i < t.size(); ++i) p[i] = t[i].data_ptr<int32_t>();
  v.kv_count = p[0], v.kv_index = p[1], v.full_count = p[2], v.full_index = p[3];
  v.q_count = p[4], v.q_index = p[5], v.full_q_count = p[6], v.full_q_index = p[7];
  return v;
}

// attnlab.create_block_mask: the 8 tensors of `spec`'s block mask for (B, H,
// Q_LEN, KV_LEN) on `device`, built on the GPU (build_block_mask_from_mod),
// and the spec's canonical form.
std::tuple<std::vector<at::Tensor>, std::string> bs_create_block_mask(const std::string& spec, int64_t B, int64_t H,
                                                                      int64_t Nq, int64_t Nk, int64_t block_q,
                                                                      int64_t block_kv, const std::string& device_name,
                                                                      const std::optional<at::Tensor>& doc_ids,
                                                                      const std::optional<at::Tensor>& mask_bits) {
  constexpr const char* where = "attnlab.create_block_mask";
  const c10::Device device(device_name);
  ATTNLAB_RAISE_UNLESS(device.is_cuda(), py::value_error, where,
                       "the block mask is built on a CUDA device, got device '" + device_name + "'");
  ATTNLAB_RAISE_UNLESS(B >= 1 && H >= 1 && Nq >= 1 && Nk >= 1 && block_q >= 1 && block_kv >= 1 && B <= 65535 &&
                           H <= 65535 && Nq < (int64_t(1) << 31) && Nk < (int64_t(1) << 31) && block_q <= (1 << 20) &&
                           block_kv <= (1 << 20),
                       py::value_error, where,
                       "B, H, Q_LEN, KV_LEN and BLOCK_SIZE must be >= 1 (B, H <= 65535; lengths < 2^31)");
  const std::string why = attnlab::block_mask_gpu_unsupported(int(B), int(H), int(Nq), int(Nk), int(block_q),
                                                              int(block_kv));
  ATTNLAB_RAISE_UNLESS(why.empty(), py::value_error, where, why);
  const attnlab::MaskMod mask = checked_mask_mod(spec, Nq, Nk, doc_ids, B, device, where, mask_bits, H);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t M = ceil_div(Nq, block_q), N = ceil_div(Nk, block_kv);
  const auto opts = at::TensorOptions().dtype(at::kInt).device(device);
  std::vector<at::Tensor> t = {at::empty({B, H, M}, opts), at::empty({B, H, M, N}, opts),
                               at::empty({B, H, M}, opts), at::empty({B, H, M, N}, opts),
                               at::empty({B, H, N}, opts), at::empty({B, H, N, M}, opts),
                               at::empty({B, H, N}, opts), at::empty({B, H, N, M}, opts)};
  attnlab::BlockMaskView v = checked_block_mask(t, Nq, Nk, block_q, block_kv, device, where);
  const at::Tensor kinds = at::empty({B, H, M, N}, opts.dtype(at::kChar));
  v.kinds = static_cast<int8_t*>(kinds.data_ptr());
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::build_block_mask_from_mod(mask, v, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": building the block mask failed: " + failure_text(nullptr, err));
  return {t, attnlab::mask_mod_name(mask)};
}

// attnlab.BlockMask's validation: block_mask_invalid on the 8 tensors (copied
// to the host), "" when they are a valid block mask for Q_LEN x KV_LEN.
std::string bs_block_mask_invalid(const std::vector<at::Tensor>& t, int64_t Nq, int64_t Nk, int64_t block_q,
                                  int64_t block_kv) {
  ATTNLAB_RAISE_UNLESS(t.size() == 8, py::value_error, "attnlab.block_mask_invalid", "a block mask is 8 tensors");
  const attnlab::BlockMaskView v = checked_block_mask(t, Nq, Nk, block_q, block_kv, t[0].device(),
                                                      "attnlab.block_mask_invalid");
  attnlab::BlockMask bm;
  bm.B = v.B, bm.H = v.H, bm.Nq = v.Nq, bm.Nk = v.Nk, bm.block_q = v.block_q, bm.block_kv = v.block_kv;
  bm.m_blocks = v.m_blocks, bm.n_blocks = v.n_blocks;
  std::vector<int32_t>* lists[8] = {&bm.kv_count, &bm.kv_index, &bm.full_count, &bm.full_index,
                                    &bm.q_count,  &bm.q_index,  &bm.full_q_count, &bm.full_q_index};
  for (size_t i = 0; i < 8; ++i) {
    const at::Tensor host = t[i].cpu();
    lists[i]->assign(host.data_ptr<int32_t>(), host.data_ptr<int32_t>() + host.numel());
  }
  return attnlab::block_mask_invalid(bm, bm.B, bm.H, bm.Nq, bm.Nk);
}

// attnlab.flex_attention's forward: (out [B, H, Nq, Dv], lse [B, H, Nq] fp32)
// of blocksparse_fwd on the forward lists (the first 4 tensors).
std::tuple<at::Tensor, at::Tensor> bs_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                              const std::vector<at::Tensor>& kv_lists, int64_t block_q,
                                              int64_t block_kv, const std::string& mask_spec,
                                              const std::string& score_spec, std::optional<double> scale,
                                              bool enable_gqa, const std::optional<at::Tensor>& doc_ids,
                                              const std::optional<at::Tensor>& mask_bits,
                                              const std::optional<at::Tensor>& bias) {
  constexpr const char* where = "attnlab.flex_attention";
  const AttnProblem p = checked_problem(q_in, k_in, v_in, false, scale, enable_gqa, where);
  const attnlab::BlockMaskView view = checked_block_mask(kv_lists, p.Nq, p.Nk, block_q, block_kv, q_in.device(), where);
  const attnlab::MaskMod mask =
      checked_mask_mod(mask_spec, p.Nq, p.Nk, doc_ids, p.B, q_in.device(), where, mask_bits, p.H);
  const attnlab::ScoreMod score = checked_score_mod(score_spec, p, q_in, bias, std::nullopt, where);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const std::string why = attnlab::blocksparse_fwd_unsupported(p, view);
  ATTNLAB_RAISE_UNLESS(why.empty(), py::value_error, where, "does not support " + p.shape_string() + ": " + why);
  const at::Tensor q = aligned16(q_in), k = aligned16(k_in), v = aligned16(v_in);
  at::Tensor o = at::empty({p.B, p.H, p.Nq, p.Dv}, q.options());
  at::Tensor lse = at::empty({p.B, p.H, p.Nq}, q.options().dtype(at::kFloat));
  AttnBuffers b;
  b.q = q.data_ptr();
  b.k = k.data_ptr();
  b.v = v.data_ptr();
  b.o = o.data_ptr();
  b.lse = lse.data_ptr<float>();
  const at::Tensor workspace = workspace_tensor(attnlab::blocksparse_fwd_workspace_bytes(), q);  // its item counter
  b.workspace = workspace.data_ptr();
  b.workspace_bytes = attnlab::blocksparse_fwd_workspace_bytes();
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::blocksparse_fwd(p, b, view, mask, score, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": forward of " + p.shape_string() + " failed: " +
                             failure_text(nullptr, err));
  return {o, lse};
}

// attnlab.flex_attention's backward: (dq, dk, dv) of blocksparse_bwd, which
// walks the transposed lists (q_lists) and, deterministic, takes its dQ turns
// at ranks found in the forward lists (kv_lists); out and lse are the forward's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bs_backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& o_in,
    const at::Tensor& lse, const at::Tensor& dout_in, const std::vector<at::Tensor>& q_lists,
    const std::vector<at::Tensor>& kv_lists, int64_t block_q, int64_t block_kv, const std::string& mask_spec,
    const std::string& score_spec, std::optional<double> scale, bool enable_gqa,
    const std::optional<at::Tensor>& doc_ids, bool deterministic, const std::optional<at::Tensor>& mask_bits,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& dbias) {
  constexpr const char* where = "attnlab.flex_attention (backward)";
  const AttnProblem p = checked_problem(q_in, k_in, v_in, false, scale, enable_gqa, where);
  check_backward_inputs(p, q_in, o_in, lse, dout_in, where);
  ATTNLAB_RAISE_UNLESS(q_lists.size() == 4 && kv_lists.size() == 4, py::value_error, where,
                       "a block mask's lists are 4 tensors each way");
  std::vector<at::Tensor> lists(kv_lists);
  lists.insert(lists.end(), q_lists.begin(), q_lists.end());
  const attnlab::BlockMaskView view = checked_block_mask(lists, p.Nq, p.Nk, block_q, block_kv, q_in.device(), where);
  const attnlab::MaskMod mask =
      checked_mask_mod(mask_spec, p.Nq, p.Nk, doc_ids, p.B, q_in.device(), where, mask_bits, p.H);
  const attnlab::ScoreMod score = checked_score_mod(score_spec, p, q_in, bias, dbias, where);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const std::string why = attnlab::blocksparse_bwd_unsupported(p, view);
  ATTNLAB_RAISE_UNLESS(why.empty(), py::value_error, where, "does not support " + p.shape_string() + ": " + why);
  const GradLaunch g =
      grad_launch(q_in, k_in, v_in, o_in, lse, dout_in, attnlab::blocksparse_bwd_workspace_bytes(p, view));
  attnlab::launch_detail().clear();
  const cudaError_t err =
      attnlab::blocksparse_bwd(p, g.b, view, mask, score, deterministic, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": backward of " + p.shape_string() + " failed: " +
                             failure_text(nullptr, err));
  return {g.dq, g.dk, g.dv};
}

// The (b, h, q, k) in [B, H, Q_LEN, KV_LEN] that `spec` keeps, counted on the
// GPU (count_kept_pairs): the FLOP count's pairs.
int64_t bs_kept_pairs(const std::string& spec, int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                      const std::string& device_name, const std::optional<at::Tensor>& doc_ids,
                      const std::optional<at::Tensor>& mask_bits) {
  constexpr const char* where = "attnlab.kept_pairs";
  const c10::Device device(device_name);
  ATTNLAB_RAISE_UNLESS(device.is_cuda(), py::value_error, where, "pairs are counted on a CUDA device");
  ATTNLAB_RAISE_UNLESS(B >= 1 && H >= 1 && Nq >= 1 && Nk >= 1 && B <= 65535 && H <= 65535 &&
                           Nq < (int64_t(1) << 31) && Nk < (int64_t(1) << 31),
                       py::value_error, where, "B, H, Q_LEN, KV_LEN must be >= 1 (B, H <= 65535; lengths < 2^31)");
  const attnlab::MaskMod mask = checked_mask_mod(spec, Nq, Nk, doc_ids, B, device, where, mask_bits, H);
  const c10::cuda::CUDAGuard guard(device);
  const at::Tensor counter = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
  attnlab::launch_detail().clear();
  const cudaError_t err =
      attnlab::count_kept_pairs(mask, int(B), int(H), int(Nq), int(Nk),
                                reinterpret_cast<unsigned long long*>(counter.data_ptr()),
                                at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess) throw std::runtime_error(std::string(where) + ": " + failure_text(nullptr, err));
  return counter.item<int64_t>();
}

}  // namespace

// ---- the variable-length forward (for attnlab.varlen_attention) ----------------------
// q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] packed, cu_seqlens
// int32 [B + 1] on q's device; returns (o [total_q, H, Dv], lse [H, total_q]).
// check_seqlens: the offsets copied to the host and checked (one
// synchronisation) before the launch; without it, malformed offsets are
// clamped into the tensors by the kernel, never read or written past them.
std::tuple<at::Tensor, at::Tensor> varlen_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                                  const at::Tensor& v_in, const at::Tensor& cu_q,
                                                  const at::Tensor& cu_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                  bool is_causal, std::optional<double> scale, bool check_seqlens) {
  constexpr const char* where = "attnlab.varlen_attention";
#define REQUIRE_AT(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, where, message)
  for (const auto& [t, name] : {std::pair{&q_in, "q"}, std::pair{&k_in, "k"}, std::pair{&v_in, "v"}}) {
    ATTNLAB_RAISE_UNLESS(t->is_cuda() && t->device() == q_in.device(), py::value_error, where,
                         std::string(name) + " must be a CUDA tensor on q's device");
    ATTNLAB_RAISE_UNLESS(t->scalar_type() == at::kHalf || t->scalar_type() == at::kBFloat16, py::type_error, where,
                         std::string(name) + " must be float16 or bfloat16, got " + str(t->scalar_type()));
    ATTNLAB_RAISE_UNLESS(t->scalar_type() == q_in.scalar_type(), py::type_error, where,
                         "q, k and v must share a dtype");
    REQUIRE_AT(t->dim() == 3, std::string(name) + " must be 3-D [total, heads, head_dim], got shape " + str(*t));
    REQUIRE_AT(t->is_contiguous(), std::string(name) + " must be contiguous (call .contiguous()); got strides " +
                                       str(t->strides()));
  }
  for (const auto& [t, name] : {std::pair{&cu_q, "cu_seqlens_q"}, std::pair{&cu_k, "cu_seqlens_k"}}) {
    ATTNLAB_RAISE_UNLESS(t->scalar_type() == at::kInt, py::type_error, where, std::string(name) + " must be int32");
    REQUIRE_AT(t->is_cuda() && t->device() == q_in.device() && t->dim() == 1 && t->is_contiguous(),
               std::string(name) + " must be a contiguous 1-D tensor on q's device");
  }
  const int64_t total_q = q_in.size(0), H = q_in.size(1), D = q_in.size(2);
  const int64_t total_k = k_in.size(0), Hkv = k_in.size(1), Dv = v_in.size(2);
  const std::string shapes = str(q_in.sizes()) + ", " + str(k_in.sizes()) + ", " + str(v_in.sizes());
  REQUIRE_AT(v_in.size(0) == total_k && v_in.size(1) == Hkv && k_in.size(2) == D,
             "k and v must be [total_k, Hkv, D] and [total_k, Hkv, Dv] with q's D; got " + shapes);
  REQUIRE_AT(Hkv >= 1 && H % Hkv == 0, "q's heads must be a multiple of k's and v's; got " + shapes);
  REQUIRE_AT(cu_q.numel() >= 2 && cu_q.numel() == cu_k.numel(),
             "cu_seqlens_q and cu_seqlens_k must both hold B + 1 >= 2 offsets");
  REQUIRE_AT(total_q < (int64_t(1) << 31) && total_k < (int64_t(1) << 31) && H <= 65535,
             "shape too large: total rows < 2^31 and H <= 65535");
  REQUIRE_AT(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q < (int64_t(1) << 31) &&
                 max_seqlen_k < (int64_t(1) << 31),
             "max_seqlen_q and max_seqlen_k must be in [0, 2^31)");
  REQUIRE_AT(!scale || (std::isfinite(*scale) && *scale > 0), "scale must be positive");
  attnlab::VarlenProblem vp;
  vp.shape = make_problem(cu_q.numel() - 1, H, std::max<int64_t>(max_seqlen_q, 1), std::max<int64_t>(max_seqlen_k, 1),
                          D, Dv, q_in.scalar_type() == at::kBFloat16, is_causal, scale, Hkv);
  vp.total_q = int(total_q), vp.total_k = int(total_k);
  const c10::cuda::CUDAGuard guard(q_in.device());
  if (check_seqlens) {
    const at::Tensor hq = cu_q.cpu(), hk = cu_k.cpu();
    const std::vector<int> vq(hq.data_ptr<int>(), hq.data_ptr<int>() + hq.numel());
    const std::vector<int> vk(hk.data_ptr<int>(), hk.data_ptr<int>() + hk.numel());
    attnlab::VarlenProblem bounds = vp;  // the lengths are checked against the caller's max_seqlen
    bounds.shape.Nq = int(max_seqlen_q), bounds.shape.Nk = int(max_seqlen_k);
    const std::string bad = attnlab::varlen_lengths_invalid(bounds, vq, vk);
    REQUIRE_AT(bad.empty(), bad);
  }
  const std::string why = attnlab::varlen_fwd_unsupported(vp);
  REQUIRE_AT(why.empty(), "does not support " + vp.shape_string() + ": " + why);
#undef REQUIRE_AT
  const at::Tensor q = aligned16(q_in), k = aligned16(k_in), v = aligned16(v_in);
  at::Tensor o = at::empty({total_q, H, Dv}, q.options());
  at::Tensor lse = at::empty({H, total_q}, q.options().dtype(at::kFloat));
  const size_t bytes = attnlab::varlen_fwd_workspace_bytes(vp);
  const at::Tensor workspace = workspace_tensor(bytes, q);
  attnlab::VarlenBuffers b;
  b.q = q.data_ptr(), b.k = k.data_ptr(), b.v = v.data_ptr();
  b.cu_seqlens_q = cu_q.data_ptr<int>(), b.cu_seqlens_k = cu_k.data_ptr<int>();
  b.o = o.data_ptr(), b.lse = lse.data_ptr<float>();
  b.workspace = workspace.data_ptr(), b.workspace_bytes = bytes;
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::varlen_fwd(vp, b, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": forward of " + vp.shape_string() + " failed: " +
                             failure_text(nullptr, err));
  return {o, lse};
}

// attnlab.varlen_attention's backward: (dq, dk, dv) packed like q, k, v, from
// the forward's out and lse [H, total_q]; the offsets were checked by the forward.
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& o_in,
    const at::Tensor& lse, const at::Tensor& dout_in, const at::Tensor& cu_q, const at::Tensor& cu_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, bool is_causal, std::optional<double> scale) {
  constexpr const char* where = "attnlab.varlen_attention (backward)";
#define REQUIRE_AT(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, where, message)
  const int64_t total_q = q_in.size(0), H = q_in.size(1), D = q_in.size(2);
  const int64_t total_k = k_in.size(0), Hkv = k_in.size(1), Dv = v_in.size(2);
  for (const auto& [t, name] : {std::pair{&o_in, "out"}, std::pair{&dout_in, "the gradient of out"}}) {
    REQUIRE_AT(t->is_cuda() && t->device() == q_in.device() && t->scalar_type() == q_in.scalar_type(),
               std::string(name) + " must be on q's device in q's dtype");
    REQUIRE_AT(t->dim() == 3 && t->size(0) == total_q && t->size(1) == H && t->size(2) == Dv,
               std::string(name) + " must be [total_q, H, Dv] = " + str(at::IntArrayRef{total_q, H, Dv}) + ", got " +
                   str(*t));
  }
  REQUIRE_AT(lse.is_cuda() && lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == H &&
                 lse.size(1) == total_q && lse.is_contiguous(),
             "lse must be the forward's fp32 [H, total_q]");
  attnlab::VarlenProblem vp;
  vp.shape = make_problem(cu_q.numel() - 1, H, std::max<int64_t>(max_seqlen_q, 1), std::max<int64_t>(max_seqlen_k, 1),
                          D, Dv, q_in.scalar_type() == at::kBFloat16, is_causal, scale, Hkv);
  vp.total_q = int(total_q), vp.total_k = int(total_k);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const std::string why = attnlab::varlen_bwd_unsupported(vp);
  REQUIRE_AT(why.empty(), "does not support " + vp.shape_string() + ": " + why);
#undef REQUIRE_AT
  const at::Tensor q = aligned16(q_in.contiguous()), k = aligned16(k_in.contiguous()), v = aligned16(v_in.contiguous());
  const at::Tensor o = aligned16(o_in.contiguous()), dout = aligned16(dout_in.contiguous());
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const size_t bytes = attnlab::varlen_bwd_workspace_bytes(vp);
  const at::Tensor workspace = workspace_tensor(bytes, q);
  attnlab::VarlenGradBuffers b;
  b.q = q.data_ptr(), b.k = k.data_ptr(), b.v = v.data_ptr(), b.o = o.data_ptr(), b.lse = lse.data_ptr<float>();
  b.dout = dout.data_ptr(), b.cu_seqlens_q = cu_q.data_ptr<int>(), b.cu_seqlens_k = cu_k.data_ptr<int>();
  b.dq = dq.data_ptr(), b.dk = dk.data_ptr(), b.dv = dv.data_ptr();
  b.workspace = workspace.data_ptr(), b.workspace_bytes = bytes;
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::varlen_bwd(vp, b, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": backward of " + vp.shape_string() + " failed: " +
                             failure_text(nullptr, err));
  return {dq, dk, dv};
}

// Why the variable-length backward cannot take a batch of this shape ("" when it can).
std::string varlen_bwd_unsupported_reason(int64_t B, int64_t H, int64_t Hkv, int64_t total_q, int64_t total_k,
                                          int64_t D, int64_t Dv, bool bf16) {
  attnlab::VarlenProblem vp;
  vp.shape = make_problem(B, H, 1, 1, D, Dv, bf16, false, std::nullopt, Hkv);
  vp.total_q = int(total_q), vp.total_k = int(total_k);
  return attnlab::varlen_bwd_unsupported(vp);
}

// ---- paged-KV decoding (for attnlab.decode) ----------------------------------------
// q [B, Nq, H, D], k_cache / v_cache [num_pages, page_size, Hkv, D], block_table
// [B, max_pages] and cache_seqlens [B] int32 on q's device; returns (o [B, Nq, H,
// D], lse [B, H, Nq]). check_tables: both copied to the host and checked (one
// synchronisation) before the launch.
std::tuple<at::Tensor, at::Tensor> paged_decode_forward(const at::Tensor& q_in, const at::Tensor& k_cache,
                                                        const at::Tensor& v_cache, const at::Tensor& block_table,
                                                        const at::Tensor& cache_seqlens, bool is_causal,
                                                        std::optional<double> scale, bool check_tables) {
  constexpr const char* where = "attnlab.decode";
#define REQUIRE_AT(ok, message) ATTNLAB_RAISE_UNLESS(ok, py::value_error, where, message)
  for (const auto& [t, name] : {std::pair{&q_in, "q"}, std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    REQUIRE_AT(t->is_cuda() && t->device() == q_in.device(), std::string(name) + " must be a CUDA tensor on q's device");
    ATTNLAB_RAISE_UNLESS(t->scalar_type() == at::kHalf || t->scalar_type() == at::kBFloat16, py::type_error, where,
                         std::string(name) + " must be float16 or bfloat16, got " + str(t->scalar_type()));
    ATTNLAB_RAISE_UNLESS(t->scalar_type() == q_in.scalar_type(), py::type_error, where,
                         "q and the caches must share a dtype");
    REQUIRE_AT(t->dim() == 4 && t->is_contiguous(), std::string(name) + " must be a contiguous 4-D tensor, got shape " +
                                                        str(*t) + " strides " + str(t->strides()));
  }
  for (const auto& [t, name] : {std::pair{&block_table, "block_table"}, std::pair{&cache_seqlens, "cache_seqlens"}}) {
    ATTNLAB_RAISE_UNLESS(t->scalar_type() == at::kInt, py::type_error, where, std::string(name) + " must be int32");
    REQUIRE_AT(t->is_cuda() && t->device() == q_in.device() && t->is_contiguous(),
               std::string(name) + " must be a contiguous tensor on q's device");
  }
  const int64_t B = q_in.size(0), Nq = q_in.size(1), H = q_in.size(2), D = q_in.size(3);
  const int64_t pages = k_cache.size(0), page_size = k_cache.size(1), Hkv = k_cache.size(2), Dv = v_cache.size(3);
  REQUIRE_AT(k_cache.size(3) == D && v_cache.size(0) == pages && v_cache.size(1) == page_size && v_cache.size(2) == Hkv,
             "k_cache and v_cache must be [num_pages, page_size, Hkv, D] and [.., Dv] with q's D; got " + str(k_cache) +
                 ", " + str(v_cache));
  REQUIRE_AT(block_table.dim() == 2 && block_table.size(0) == B, "block_table must be [B, max_pages]; got " + str(block_table));
  REQUIRE_AT(cache_seqlens.dim() == 1 && cache_seqlens.size(0) == B, "cache_seqlens must be [B]; got " + str(cache_seqlens));
  REQUIRE_AT(pages < (int64_t(1) << 31) && page_size < (int64_t(1) << 31) && block_table.size(1) < (int64_t(1) << 31),
             "the cache's dimensions must be below 2^31");
  REQUIRE_AT(!scale || (std::isfinite(*scale) && *scale > 0), "scale must be positive");
  attnlab::PagedDecodeProblem dp;
  dp.shape = make_problem(B, H, Nq, 1, D, Dv, q_in.scalar_type() == at::kBFloat16, is_causal, scale, Hkv);
  dp.num_pages = int(pages), dp.page_size = int(page_size), dp.max_pages = int(block_table.size(1));
  const c10::cuda::CUDAGuard guard(q_in.device());
  const std::string why = attnlab::paged_decode_unsupported(dp);
  REQUIRE_AT(why.empty(), "does not support " + dp.shape_string() + ": " + why);
  if (check_tables) {
    const at::Tensor ht = block_table.cpu(), hs = cache_seqlens.cpu();
    const std::vector<int> vt(ht.data_ptr<int>(), ht.data_ptr<int>() + ht.numel());
    const std::vector<int> vs(hs.data_ptr<int>(), hs.data_ptr<int>() + hs.numel());
    const std::string bad = attnlab::paged_decode_tables_invalid(dp, vt, vs);
    REQUIRE_AT(bad.empty(), bad);
  }
#undef REQUIRE_AT
  const at::Tensor q = aligned16(q_in), k = aligned16(k_cache), v = aligned16(v_cache);
  at::Tensor o = at::empty({B, Nq, H, Dv}, q.options());
  at::Tensor lse = at::empty({B, H, Nq}, q.options().dtype(at::kFloat));
  const size_t bytes = attnlab::paged_decode_workspace_bytes(dp);
  const at::Tensor workspace = workspace_tensor(bytes, q);
  attnlab::PagedDecodeBuffers b;
  b.q = q.data_ptr(), b.k_cache = k.data_ptr(), b.v_cache = v.data_ptr();
  b.block_table = block_table.data_ptr<int>(), b.cache_seqlens = cache_seqlens.data_ptr<int>();
  b.o = o.data_ptr(), b.lse = lse.data_ptr<float>(), b.workspace = workspace.data_ptr(), b.workspace_bytes = bytes;
  attnlab::launch_detail().clear();
  const cudaError_t err = attnlab::paged_decode(dp, b, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": " + dp.shape_string() + " failed: " + failure_text(nullptr, err));
  return {o, lse};
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "attnlab: attention kernels, one technique per rung";
  m.def("variants", &variant_names, "Names of every registered variant, in ladder order.");
  m.def("forward", &forward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("variant"),
        pybind11::arg("is_causal") = false, pybind11::arg("scale") = pybind11::none(),
        pybind11::arg("enable_gqa") = false,
        "Attention of q [B,H,Nq,D], k [B,Hkv,Nk,D], v [B,Hkv,Nk,Dv] (CUDA, fp16/bf16, contiguous; Hkv != H needs "
        "enable_gqa); returns (o, lse).");
  m.def("unsupported_reason", &unsupported_reason, pybind11::arg("variant"), pybind11::arg("B"), pybind11::arg("H"),
        pybind11::arg("Nq"), pybind11::arg("Nk"), pybind11::arg("D"), pybind11::arg("Dv"), pybind11::arg("bf16"),
        pybind11::arg("is_causal"), pybind11::arg("Hkv") = 0,
        "Why a variant cannot run a problem ('' when it can); Hkv: KV heads (0: = H).");
  m.def("bwd_variants", &bwd_variant_names, "Names of every registered backward variant, in ladder order.");
  m.def("bwd_deterministic", &bwd_deterministic, pybind11::arg("variant"),
        "Whether a backward variant's gradients are bitwise identical run to run.");
  m.def("backward", &backward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("o"),
        pybind11::arg("lse"), pybind11::arg("dout"), pybind11::arg("variant"), pybind11::arg("is_causal") = false,
        pybind11::arg("scale") = pybind11::none(), pybind11::arg("enable_gqa") = false,
        "dq, dk, dv of L = sum(o * dout) from forward's (o, lse), with one backward variant (use attnlab.attention).");
  m.def("bwd_unsupported_reason", &bwd_unsupported_reason, pybind11::arg("variant"), pybind11::arg("B"),
        pybind11::arg("H"), pybind11::arg("Nq"), pybind11::arg("Nk"), pybind11::arg("D"), pybind11::arg("Dv"),
        pybind11::arg("bf16"), pybind11::arg("is_causal"), pybind11::arg("Hkv") = 0,
        "Why a backward variant cannot run a problem ('' when it can); Hkv: KV heads (0: = H).");
  m.def("judge", &judge, "The check rule: (pass, tolerance) from measured errors.");
  m.attr("lse_tolerance") = attnlab::kLseTolerance;
  m.def("dma_forward", &dma_forward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("mask"), pybind11::arg("bias"), pybind11::arg("is_causal"), pybind11::arg("scale"),
        pybind11::arg("softcap"), pybind11::arg("check_backward"), pybind11::arg("mask_summary") = pybind11::none(),
        "Dynamic-mask attention forward (use attnlab.dynamic_mask_attention); returns (out, lse, mask summary "
        "for the backward or None). mask_summary: dma_build_mask_summary's output (no mask scan then).");
  m.def("dma_pack_mask_bits", &dma_pack_mask_bits, pybind11::arg("mask"),
        "A 4-D bool/uint8 mask as bit-packed int32 words (use attnlab.pack_mask).");
  m.def("dma_build_mask_summary", &dma_build_mask_summary, pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("mask"), pybind11::arg("is_causal"),
        "The mask's 64x64 tile summary as uint8 (use attnlab.build_mask_summary).");
  m.def("dma_backward", &dma_backward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("grad_out"), pybind11::arg("mask"),
        pybind11::arg("bias"), pybind11::arg("is_causal"), pybind11::arg("scale"), pybind11::arg("softcap"),
        pybind11::arg("need_dbias"), pybind11::arg("deterministic"), pybind11::arg("mask_summary") = pybind11::none(),
        "Dynamic-mask attention backward; returns (dq, dk, dv, dbias or None). mask_summary: dma_forward's "
        "third output (the backward then skips its own mask pre-pass).");
  m.def("parse_mask_mod", &bs_parse_mask_mod, pybind11::arg("spec"), pybind11::arg("Q_LEN"), pybind11::arg("KV_LEN"),
        "A mask_mod spec's canonical form (ValueError with one line when it is not one).");
  m.def("parse_score_mod", &bs_parse_score_mod, pybind11::arg("spec"), pybind11::arg("H"),
        "A score_mod spec's canonical form (ValueError with one line when it is not one).");
  m.def("blocksparse_create_block_mask", &bs_create_block_mask, pybind11::arg("mask_mod"), pybind11::arg("B"),
        pybind11::arg("H"), pybind11::arg("Q_LEN"), pybind11::arg("KV_LEN"), pybind11::arg("block_q"),
        pybind11::arg("block_kv"), pybind11::arg("device"), pybind11::arg("doc_ids") = pybind11::none(),
        pybind11::arg("mask_bits") = pybind11::none(),
        "A mask_mod spec's block mask built on the GPU: ([8 int32 tensors in torch's BlockMask order], canonical "
        "spec) (use attnlab.create_block_mask).");
  m.def("block_mask_invalid", &bs_block_mask_invalid, pybind11::arg("tensors"), pybind11::arg("Q_LEN"),
        pybind11::arg("KV_LEN"), pybind11::arg("block_q"), pybind11::arg("block_kv"),
        "Why 8 block-mask tensors are not a valid block mask for Q_LEN x KV_LEN ('' when they are).");
  m.def("blocksparse_forward", &bs_forward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("kv_lists"), pybind11::arg("block_q"), pybind11::arg("block_kv"), pybind11::arg("mask_mod"),
        pybind11::arg("score_mod"), pybind11::arg("scale") = pybind11::none(), pybind11::arg("enable_gqa") = false,
        pybind11::arg("doc_ids") = pybind11::none(), pybind11::arg("mask_bits") = pybind11::none(),
        pybind11::arg("bias") = pybind11::none(),
        "The block-sparse forward on a block mask's forward lists; returns (out, lse) (use attnlab.flex_attention).");
  m.def("blocksparse_backward", &bs_backward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("o"), pybind11::arg("lse"), pybind11::arg("dout"), pybind11::arg("q_lists"),
        pybind11::arg("kv_lists"), pybind11::arg("block_q"), pybind11::arg("block_kv"), pybind11::arg("mask_mod"),
        pybind11::arg("score_mod"), pybind11::arg("scale") = pybind11::none(), pybind11::arg("enable_gqa") = false,
        pybind11::arg("doc_ids") = pybind11::none(), pybind11::arg("deterministic") = false,
        pybind11::arg("mask_bits") = pybind11::none(), pybind11::arg("bias") = pybind11::none(),
        pybind11::arg("dbias") = pybind11::none(),
        "The block-sparse backward on a block mask's transposed lists; returns (dq, dk, dv) "
        "(use attnlab.flex_attention's autograd).");
  m.def("blocksparse_bwd_unsupported_reason", &bs_bwd_unsupported_reason, pybind11::arg("B"), pybind11::arg("H"),
        pybind11::arg("Nq"), pybind11::arg("Nk"), pybind11::arg("D"), pybind11::arg("Dv"), pybind11::arg("bf16"),
        pybind11::arg("Hkv") = 0,
        "Why the block-sparse backward cannot take a problem whatever its block mask ('' when it can).");
  m.def("blocksparse_kept_pairs", &bs_kept_pairs, pybind11::arg("mask_mod"), pybind11::arg("B"), pybind11::arg("H"),
        pybind11::arg("Q_LEN"), pybind11::arg("KV_LEN"), pybind11::arg("device"),
        pybind11::arg("doc_ids") = pybind11::none(), pybind11::arg("mask_bits") = pybind11::none(),
        "The exact number of (b, h, q, k) pairs a mask_mod spec keeps, counted on the GPU.");
  m.def("varlen_forward", &varlen_forward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("cu_seqlens_q"), pybind11::arg("cu_seqlens_k"), pybind11::arg("max_seqlen_q"),
        pybind11::arg("max_seqlen_k"), pybind11::arg("is_causal") = false, pybind11::arg("scale") = pybind11::none(),
        pybind11::arg("check_seqlens") = true,
        "The variable-length forward on packed q, k, v; returns (out [total_q, H, Dv], lse [H, total_q]) "
        "(use attnlab.varlen_attention).");
  m.def("varlen_backward", &varlen_backward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("o"), pybind11::arg("lse"), pybind11::arg("dout"), pybind11::arg("cu_seqlens_q"),
        pybind11::arg("cu_seqlens_k"), pybind11::arg("max_seqlen_q"), pybind11::arg("max_seqlen_k"),
        pybind11::arg("is_causal") = false, pybind11::arg("scale") = pybind11::none(),
        "The variable-length backward; returns (dq, dk, dv) (use attnlab.varlen_attention's autograd).");
  m.def("varlen_bwd_unsupported_reason", &varlen_bwd_unsupported_reason, pybind11::arg("B"), pybind11::arg("H"),
        pybind11::arg("Hkv"), pybind11::arg("total_q"), pybind11::arg("total_k"), pybind11::arg("D"),
        pybind11::arg("Dv"), pybind11::arg("bf16"),
        "Why the variable-length backward cannot take a batch of this shape ('' when it can).");
  m.def("paged_decode", &paged_decode_forward, pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_table"), pybind11::arg("cache_seqlens"), pybind11::arg("is_causal") = true,
        pybind11::arg("scale") = pybind11::none(), pybind11::arg("check_tables") = true,
        "Decoding against a paged KV cache; returns (o [B, Nq, H, Dv], lse [B, H, Nq]) (use attnlab.decode).");
}
