// attnlab's Python module (attnlab._C): the registered variants on torch tensors.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/variant.h"
#include "reference/reference.h"

namespace {

namespace py = pybind11;

// Clean Python exceptions (ValueError, TypeError) with one-line messages; torch's
// own TORCH_CHECK would surface as RuntimeError with a C++ backtrace. Macros, so
// the message is only built when the check fails. Messages are plain string
// concatenation: iostream formatting (c10::str) crashed inside this module on
// the GPU machine's image (a segfault in std::ostream, seen with both pybind11
// builds), so the module uses none.
#define ATTNLAB_REQUIRE_VALUE(ok, message) \
  if (!(ok)) throw py::value_error(std::string("attnlab.forward: ") + (message))
#define ATTNLAB_REQUIRE_TYPE(ok, message) \
  if (!(ok)) throw py::type_error(std::string("attnlab.forward: ") + (message))

std::string str(at::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
std::string str(const at::Tensor& t) { return str(t.sizes()); }
std::string str(at::ScalarType t) { return c10::toString(t); }
std::string str(const c10::Device& d) { return d.str(); }

using attnlab::AttnBuffers;
using attnlab::AttnProblem;
using attnlab::DType;
using attnlab::Variant;

std::vector<std::string> variant_names() {
  std::vector<std::string> names;
  for (const Variant& v : attnlab::all_variants()) names.push_back(v.name);
  return names;
}

const Variant& find_variant(const std::string& name) {
  for (const Variant& v : attnlab::all_variants())
    if (v.name == name) return v;
  std::string known;
  for (const std::string& n : variant_names()) known += (known.empty() ? "" : ", ") + n;
  throw py::value_error("attnlab.forward: unknown variant '" + name + "'; known: " + known);
}

AttnProblem make_problem(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D, int64_t Dv, bool bf16,
                         bool is_causal, std::optional<double> scale) {
  AttnProblem p;
  p.B = int(B);
  p.H = int(H);
  p.Nq = int(Nq);
  p.Nk = int(Nk);
  p.D = int(D);
  p.Dv = int(Dv);
  p.dtype = bf16 ? DType::kBFloat16 : DType::kFloat16;
  p.causal = is_causal;
  p.scale = scale ? float(*scale) : attnlab::default_scale(p.D);
  return p;
}

void check_tensor(const at::Tensor& t, const std::string& name, const at::Tensor& q) {
  ATTNLAB_REQUIRE_VALUE(t.is_cuda(), name + " must be a CUDA tensor, got one on " + str(t.device()));
  ATTNLAB_REQUIRE_VALUE(t.device() == q.device(),
                        "q, k and v must be on one device (" + name + " is on " + str(t.device()) + ", q on " +
                            str(q.device()) + ")");
  ATTNLAB_REQUIRE_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
                       name + " must be float16 or bfloat16, got " + str(t.scalar_type()));
  ATTNLAB_REQUIRE_TYPE(t.scalar_type() == q.scalar_type(), "q, k and v must share a dtype (" + name + " is " +
                                                               str(t.scalar_type()) + ", q is " +
                                                               str(q.scalar_type()) + ")");
  ATTNLAB_REQUIRE_VALUE(t.dim() == 4, name + " must be 4-D [B, H, N, D], got shape " + str(t.sizes()));
  ATTNLAB_REQUIRE_VALUE(t.is_contiguous(), name + " must be contiguous in [B, H, N, D] layout (call .contiguous()); "
                                                  "got strides " + str(t.strides()));
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const std::string& variant, bool is_causal, std::optional<double> scale) {
  check_tensor(q, "q", q);
  check_tensor(k, "k", q);
  check_tensor(v, "v", q);
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2), Dv = v.size(3);
  const std::string shapes = str(q.sizes()) + ", " + str(k.sizes()) + ", " + str(v.sizes());
  ATTNLAB_REQUIRE_VALUE(k.size(0) == B && k.size(1) == H && v.size(0) == B && v.size(1) == H,
                        "q, k, v must share B and H; got " + shapes);
  ATTNLAB_REQUIRE_VALUE(k.size(3) == D, "k's head dim must equal q's (" + std::to_string(k.size(3)) + " vs " +
                                            std::to_string(D) + ")");
  ATTNLAB_REQUIRE_VALUE(v.size(2) == Nk, "v must have as many rows as k (" + std::to_string(v.size(2)) + " vs " +
                                             std::to_string(Nk) + ")");
  ATTNLAB_REQUIRE_VALUE(B >= 1 && H >= 1 && Nq >= 1 && Nk >= 1 && D >= 1 && Dv >= 1,
                        "every dimension must be at least 1; got " + shapes);
  ATTNLAB_REQUIRE_VALUE(B <= 65535 && H <= 65535 && Nq < (int64_t(1) << 31) && Nk < (int64_t(1) << 31),
                        "shape too large: B and H must be <= 65535 and N < 2^31");
  ATTNLAB_REQUIRE_VALUE(!scale || (std::isfinite(*scale) && *scale > 0), "scale must be positive");

  const AttnProblem p = make_problem(B, H, Nq, Nk, D, Dv, q.scalar_type() == at::kBFloat16, is_causal, scale);

  const c10::cuda::CUDAGuard guard(q.device());
  const Variant& var = find_variant(variant);
  const std::string why = var.unsupported_reason(p);
  ATTNLAB_REQUIRE_VALUE(why.empty(), "variant '" + variant + "' does not support " + p.shape_string() + ": " + why);
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
  const cudaError_t err = var.launch(p, b, at::cuda::getCurrentCUDAStream());
  if (err != cudaSuccess)
    throw std::runtime_error("attnlab.forward: " + variant + " failed: " + cudaGetErrorString(err));
  return {o, lse};
}

// Why `variant` cannot run this problem ("" when it can), for tests to skip.
std::string unsupported_reason(const std::string& variant, int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D,
                               int64_t Dv, bool bf16, bool is_causal) {
  return find_variant(variant).unsupported_reason(make_problem(B, H, Nq, Nk, D, Dv, bf16, is_causal, std::nullopt));
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

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "attnlab: attention kernels, one technique per rung";
  m.def("variants", &variant_names, "Names of every registered variant, in ladder order.");
  m.def("forward", &forward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("variant"),
        pybind11::arg("is_causal") = false, pybind11::arg("scale") = pybind11::none(),
        "Attention of q [B,H,Nq,D], k [B,H,Nk,D], v [B,H,Nk,Dv] (CUDA, fp16/bf16, contiguous); returns (o, lse).");
  m.def("unsupported_reason", &unsupported_reason, "Why a variant cannot run a problem ('' when it can).");
  m.def("judge", &judge, "The check rule: (pass, tolerance) from measured errors.");
  m.attr("lse_tolerance") = attnlab::kLseTolerance;
}
