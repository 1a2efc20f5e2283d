// attnlab: PyTorch peers (see torch_peers.h). Every row wraps the harness's own
// device buffers with at::from_blob (no copies of the inputs) and runs on the
// harness's stream, so its CUDA-event timing is the same as for the rungs.
#include "torch_peers.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/version.h>

#include <limits>
#include <map>
#include <memory>
#include <tuple>

namespace attnlab {
namespace {

at::ScalarType scalar_type(DType t) { return t == DType::kFloat16 ? at::kHalf : at::kBFloat16; }

int current_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

at::Tensor wrap(const void* ptr, at::IntArrayRef shape, at::ScalarType type) {
  return at::from_blob(const_cast<void*>(ptr), shape,
                       at::TensorOptions().dtype(type).device(at::kCUDA, current_device()));
}

struct Wrapped {
  at::Tensor q, k, v, o, lse;  // [B,H,Nq,D] [B,Hkv,Nk,D] [B,Hkv,Nk,Dv] [B,H,Nq,Dv] [B,H,Nq] fp32
};

Wrapped wrap_buffers(const AttnProblem& p, const AttnBuffers& b) {
  const auto t = scalar_type(p.dtype);
  const int64_t hkv = p.kv_heads();
  return {wrap(b.q, {p.B, p.H, p.Nq, p.D}, t), wrap(b.k, {p.B, hkv, p.Nk, p.D}, t),
          wrap(b.v, {p.B, hkv, p.Nk, p.Dv}, t), wrap(b.o, {p.B, p.H, p.Nq, p.Dv}, t),
          wrap(b.lse, {p.B, p.H, p.Nq}, at::kFloat)};
}

// K or V of Hkv heads repeated to H (each KV head H / Hkv times, in place of
// its query heads): the GQA layout for code that takes only H heads.
at::Tensor repeat_kv(const at::Tensor& kv, const AttnProblem& p) {
  const int64_t group = p.H / p.kv_heads();
  return group > 1 ? kv.repeat_interleave(group, 1) : kv;
}

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > 160) line = line.substr(0, 157) + "...";
  return line;
}

// Runs `fn` with `stream` as torch's current stream; a torch exception becomes
// `*error` (torch's own words) and a non-success code.
template <typename Fn>
cudaError_t on_stream(cudaStream_t stream, std::string* error, Fn fn) {
  try {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(stream, current_device()));
    fn();
    error->clear();
    return cudaSuccess;
  } catch (const c10::Error& e) {
    *error = first_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *error = first_line(e.what());
  }
  return cudaErrorNotSupported;
}

// Keys j > i + (Nk - Nq) are masked (true = masked), built once per shape.
at::Tensor causal_mask(int64_t nq, int64_t nk) {
  static std::map<std::pair<int64_t, int64_t>, at::Tensor> cache;
  auto it = cache.find({nq, nk});
  if (it != cache.end()) return it->second;
  const auto opts = at::TensorOptions().device(at::kCUDA, current_device()).dtype(at::kLong);
  const at::Tensor i = at::arange(nq, opts).unsqueeze(1), j = at::arange(nk, opts).unsqueeze(0);
  at::Tensor mask = j > i + (nk - nq);
  cache.emplace(std::make_pair(nq, nk), mask);
  return mask;
}

// Writes a peer's output and LSE into the harness's buffers, for the check.
void store(const Wrapped& w, const at::Tensor& out, const at::Tensor& lse, const AttnProblem& p) {
  w.o.copy_(out);
  w.lse.copy_(lse.reshape({p.B, p.H, -1}).narrow(2, 0, p.Nq));
}

// ---- torch(unfused): no LSE of its own, so its check judges O alone -----------
// GQA: K and V are repeated to H heads inside the timed call, so that the peer
// does the whole work from the same inputs as the rungs.
at::Tensor torch_unfused(const Wrapped& w, const AttnProblem& p) {
  at::Tensor s = at::matmul(w.q, repeat_kv(w.k, p).transpose(-2, -1)).mul_(p.scale);
  if (p.causal) s.masked_fill_(causal_mask(p.Nq, p.Nk), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(s, -1), repeat_kv(w.v, p));
}

// ---- SDPA backends ------------------------------------------------------------
// GQA: each backend gets K and V of Hkv heads, as scaled_dot_product_attention
// with enable_gqa=True hands them to flash and cuDNN (torch 2.11); a backend
// that refuses them (there, efficient) is unsupported, its row saying so.
enum class Backend { kFlash, kCudnn, kEfficient };

std::tuple<at::Tensor, at::Tensor> sdpa(Backend backend, const Wrapped& w, const AttnProblem& p, bool want_lse) {
  const double scale = p.scale;
  switch (backend) {
    case Backend::kFlash: {
      auto r = at::_scaled_dot_product_flash_attention(w.q, w.k, w.v, 0.0, p.causal, false, scale);
      return {std::get<0>(r), std::get<1>(r)};
    }
    case Backend::kCudnn: {
      auto r = at::_scaled_dot_product_cudnn_attention(w.q, w.k, w.v, std::nullopt, want_lse, 0.0, p.causal, false,
                                                       scale);
      return {std::get<0>(r), std::get<1>(r)};
    }
    case Backend::kEfficient: {
      auto r = at::_scaled_dot_product_efficient_attention(w.q, w.k, w.v, std::nullopt, want_lse, 0.0, p.causal,
                                                           scale);
      return {std::get<0>(r), std::get<1>(r)};
    }
  }
  return {};
}

// Whether a backend runs a problem: torch's is_causal is top-left aligned, and
// otherwise torch decides — a small trial call per (D, Dv, dtype, causal, GQA
// or not) returns its own message.
std::string sdpa_unsupported(Backend backend, const AttnProblem& p) {
  if (p.causal && p.Nq != p.Nk) return "torch's is_causal is top-left aligned when Nq != Nk (attnlab: bottom-right)";
  if (p.gqa()) {  // a reason that has nothing to do with GQA first
    AttnProblem mha = p;
    mha.Hkv = 0;
    if (std::string why = sdpa_unsupported(backend, mha); !why.empty()) return why;
  }
  static std::map<std::tuple<int, int, int, int, int, bool>, std::string> cache;
  const auto key = std::make_tuple(int(backend), p.D, p.Dv, int(p.dtype), int(p.causal), p.gqa());
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::string reason;
  try {
    AttnProblem small = p;  // GQA: two query heads on one KV head
    small.B = small.Hkv = 1;
    small.H = p.gqa() ? 2 : 1;
    small.Nq = small.Nk = 256;
    const auto opts = at::TensorOptions().dtype(scalar_type(p.dtype)).device(at::kCUDA, current_device());
    Wrapped w{at::randn({1, small.H, 256, p.D}, opts), at::randn({1, 1, 256, p.D}, opts),
              at::randn({1, 1, 256, p.Dv}, opts), at::Tensor(), at::Tensor()};
    sdpa(backend, w, small, true);
    cudaDeviceSynchronize();
  } catch (const c10::Error& e) {
    reason = first_line(e.what_without_backtrace());
    if (p.gqa()) reason = "no GQA (K, V of fewer heads than Q): " + reason;
  }
  cache.emplace(key, reason);
  return reason;
}

Variant make_sdpa_peer(const std::string& name, Backend backend) {
  auto error = std::make_shared<std::string>();
  Variant v;
  v.name = name;
  v.rung = "torch " TORCH_VERSION;
  v.is_peer = true;
  v.unsupported_reason = [backend](const AttnProblem& p) { return sdpa_unsupported(backend, p); };
  v.launch = [backend, error](const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
    return on_stream(s, error.get(), [&] {
      const Wrapped w = wrap_buffers(p, b);
      auto [out, lse] = sdpa(backend, w, p, true);
      store(w, out, lse, p);
    });
  };
  v.launch_timed = [backend, error](const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
    return on_stream(s, error.get(), [&] { sdpa(backend, wrap_buffers(p, b), p, false); });
  };
  v.last_error = [error] { return *error; };
  v.describe = [name] { return "torch.nn.functional.scaled_dot_product_attention, " + name + " backend"; };
  return v;
}

}  // namespace

bool have_torch() { return true; }
std::string torch_version() { return TORCH_VERSION; }

std::vector<Variant> make_torch_unfused_peers() {
  auto error = std::make_shared<std::string>();
  Variant v;
  v.name = "torch(unfused)";
  v.rung = "torch " TORCH_VERSION;
  v.is_peer = true;
  v.unsupported_reason = [](const AttnProblem&) { return std::string(); };
  v.launch = [error](const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
    return on_stream(s, error.get(), [&] {
      const Wrapped w = wrap_buffers(p, b);
      w.o.copy_(torch_unfused(w, p));
    });
  };
  v.launch_timed = [error](const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
    return on_stream(s, error.get(), [&] { torch_unfused(wrap_buffers(p, b), p); });
  };
  v.writes_lse = false;
  v.last_error = [error] { return *error; };
  v.describe = [] { return std::string("eager PyTorch: softmax(q @ k^T * scale) @ v"); };
  return {v};
}

std::vector<Variant> make_sdpa_peers() {
  return {make_sdpa_peer("sdpa(flash)", Backend::kFlash), make_sdpa_peer("sdpa(cudnn)", Backend::kCudnn),
          make_sdpa_peer("sdpa(efficient)", Backend::kEfficient)};
}

namespace {

// ---- the backward peers ---------------------------------------------------------
enum class BwdPeer { kFlash, kCudnn, kEfficient, kUnfused };

// The forward graph of one peer on leaves q [B,H,Nq,D], k, v of H heads (GQA:
// already repeated inside the graph): its output O.
at::Tensor forward_graph(BwdPeer peer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const AttnProblem& p) {
  const double scale = p.scale;
  switch (peer) {
    case BwdPeer::kFlash:
      return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, 0.0, p.causal, false, scale));
    case BwdPeer::kCudnn:
      return std::get<0>(
          at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, true, 0.0, p.causal, false, scale));
    case BwdPeer::kEfficient:
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, true, 0.0, p.causal,
                                                                     scale));
    case BwdPeer::kUnfused: {
      at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul(scale);
      if (p.causal) s = s.masked_fill(causal_mask(p.Nq, p.Nk), -std::numeric_limits<float>::infinity());
      return at::matmul(at::softmax(s, -1), v);
    }
  }
  return {};
}

// Whether an SDPA backend runs a problem's backward: torch's is_causal is
// top-left aligned, and otherwise torch decides — a small trial forward and
// backward per (D, Dv, dtype, causal) returns its own message. GQA is not
// asked about: the graph repeats K and V.
std::string sdpa_backward_unsupported(BwdPeer peer, const AttnProblem& p) {
  if (p.causal && p.Nq != p.Nk) return "torch's is_causal is top-left aligned when Nq != Nk (attnlab: bottom-right)";
  static std::map<std::tuple<int, int, int, int, int>, std::string> cache;
  const auto key = std::make_tuple(int(peer), p.D, p.Dv, int(p.dtype), int(p.causal));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::string reason;
  try {
    AttnProblem small = p;
    small.B = small.H = 1;
    small.Hkv = 0;
    small.Nq = small.Nk = 256;
    const auto opts = at::TensorOptions().dtype(scalar_type(p.dtype)).device(at::kCUDA, current_device());
    const at::Tensor q = at::randn({1, 1, 256, p.D}, opts).requires_grad_(true);
    const at::Tensor k = at::randn({1, 1, 256, p.D}, opts).requires_grad_(true);
    const at::Tensor v = at::randn({1, 1, 256, p.Dv}, opts).requires_grad_(true);
    const at::Tensor out = forward_graph(peer, q, k, v, small);
    out.backward(at::randn_like(out));
    cudaDeviceSynchronize();
  } catch (const c10::Error& e) {
    reason = first_line(e.what_without_backtrace());
  }
  cache.emplace(key, reason);
  return reason;
}

bool same_problem(const AttnProblem& a, const AttnProblem& b) {
  return a.B == b.B && a.H == b.H && a.kv_heads() == b.kv_heads() && a.Nq == b.Nq && a.Nk == b.Nk && a.D == b.D &&
         a.Dv == b.Dv && a.dtype == b.dtype && a.causal == b.causal && a.scale == b.scale;
}

// One peer's autograd graph, built for one problem on one set of buffers.
struct BwdGraph {
  AttnProblem p;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  at::Tensor q_leaf, k_leaf, v_leaf, grad_out, out;
  bool built_for(const AttnProblem& problem, const AttnGradBuffers& b) const {
    return out.defined() && same_problem(p, problem) && q == b.q && k == b.k && v == b.v && dout == b.dout;
  }
};

// Leaves that take gradients (copies of the harness's Q, K, V) and the forward graph on them.
void build_graph(BwdPeer peer, BwdGraph& g, const AttnProblem& p, const AttnGradBuffers& b) {
  g.out = at::Tensor();  // the old graph's memory first
  const auto t = scalar_type(p.dtype);
  const int64_t hkv = p.kv_heads();
  g.q_leaf = wrap(b.q, {p.B, p.H, p.Nq, p.D}, t).detach().clone().requires_grad_(true);
  g.k_leaf = wrap(b.k, {p.B, hkv, p.Nk, p.D}, t).detach().clone().requires_grad_(true);
  g.v_leaf = wrap(b.v, {p.B, hkv, p.Nk, p.Dv}, t).detach().clone().requires_grad_(true);
  g.grad_out = wrap(b.dout, {p.B, p.H, p.Nq, p.Dv}, t);
  g.out = forward_graph(peer, g.q_leaf, repeat_kv(g.k_leaf, p), repeat_kv(g.v_leaf, p), p);
  g.p = p;
  g.q = b.q;
  g.k = b.k;
  g.v = b.v;
  g.dout = b.dout;
}

// One backward through the graph, the leaves' gradients set to none first.
void run_backward(BwdGraph& g) {
  for (at::Tensor* leaf : {&g.q_leaf, &g.k_leaf, &g.v_leaf}) leaf->mutable_grad() = at::Tensor();
  g.out.backward(g.grad_out, /*retain_graph=*/true);
}

BwdVariant make_backward_peer(const std::string& name, BwdPeer peer, const std::string& about) {
  auto error = std::make_shared<std::string>();
  auto graph = std::make_shared<BwdGraph>();
  BwdVariant v;
  v.name = name;
  v.rung = "torch " TORCH_VERSION;
  v.is_peer = true;
  v.unsupported_reason = [peer](const AttnProblem& p) {
    return peer == BwdPeer::kUnfused ? std::string() : sdpa_backward_unsupported(peer, p);
  };
  v.launch = [peer, error, graph](const AttnProblem& p, const AttnGradBuffers& b, cudaStream_t s) {
    return on_stream(s, error.get(), [&] {
      if (!graph->built_for(p, b)) build_graph(peer, *graph, p, b);
      run_backward(*graph);
      const auto t = scalar_type(p.dtype);
      wrap(b.dq, {p.B, p.H, p.Nq, p.D}, t).copy_(graph->q_leaf.grad());
      wrap(b.dk, {p.B, p.kv_heads(), p.Nk, p.D}, t).copy_(graph->k_leaf.grad());
      wrap(b.dv, {p.B, p.kv_heads(), p.Nk, p.Dv}, t).copy_(graph->v_leaf.grad());
    });
  };
  v.launch_timed = [peer, error, graph](const AttnProblem& p, const AttnGradBuffers& b, cudaStream_t s) {
    return on_stream(s, error.get(), [&] {
      if (!graph->built_for(p, b)) build_graph(peer, *graph, p, b);  // (launch built it: not in the timed calls)
      run_backward(*graph);
    });
  };
  v.last_error = [error] { return *error; };
  v.describe = [about] { return about; };
  return v;
}

}  // namespace

std::vector<BwdVariant> make_torch_unfused_backward_peers() {
  return {make_backward_peer("torch(unfused)", BwdPeer::kUnfused,
                             "eager PyTorch autograd: softmax(q @ k^T * scale) @ v, the backward alone")};
}

std::vector<BwdVariant> make_sdpa_backward_peers() {
  const std::string about = " backend of scaled_dot_product_attention through autograd, the backward alone";
  return {make_backward_peer("sdpa(flash)", BwdPeer::kFlash, "the flash (FA2)" + about),
          make_backward_peer("sdpa(cudnn)", BwdPeer::kCudnn, "the cuDNN" + about),
          make_backward_peer("sdpa(efficient)", BwdPeer::kEfficient, "the memory-efficient" + about)};
}

std::string torch_reference(const AttnProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                            float* lse_ref, cudaStream_t stream) {
  std::string error;
  on_stream(stream, &error, [&] {
    // Only the inputs are wrapped: the output buffers are not allocated yet, and
    // from_blob on a null pointer fails ("resides on host memory").
    const auto t = scalar_type(p.dtype);
    const at::Tensor q32 = wrap(q, {p.B, p.H, p.Nq, p.D}, t).to(at::kFloat);
    const at::Tensor k32 = repeat_kv(wrap(k, {p.B, p.kv_heads(), p.Nk, p.D}, t).to(at::kFloat), p);
    const at::Tensor v32 = repeat_kv(wrap(v, {p.B, p.kv_heads(), p.Nk, p.Dv}, t).to(at::kFloat), p);
    // An additive float mask (0 = attend, -inf = masked). Not a boolean one: the
    // private math op gets the mask after the public entry point has already
    // converted booleans, and given a boolean itself it did not mask as
    // documented (measured on torch 2.11: O off by up to 3.3 on causal rows).
    std::optional<at::Tensor> additive;
    if (p.causal)
      additive = at::zeros({p.Nq, p.Nk}, q32.options())
                     .masked_fill_(causal_mask(p.Nq, p.Nk), -std::numeric_limits<float>::infinity());
    const at::Tensor out = std::get<0>(
        at::_scaled_dot_product_attention_math(q32, k32, v32, additive, 0.0, false, std::nullopt, double(p.scale)));
    at::Tensor s = at::matmul(q32, k32.transpose(-2, -1)).mul_(p.scale);
    if (p.causal) s.masked_fill_(causal_mask(p.Nq, p.Nk), -std::numeric_limits<float>::infinity());
    const auto fopts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, current_device());
    // A row that sees no key is defined as O = 0 (math SDPA may give NaN there,
    // and a NaN reference would hide errors from the comparison).
    at::from_blob(o_ref, {p.B, p.H, p.Nq, p.Dv}, fopts).copy_(out.nan_to_num(0.0));
    at::from_blob(lse_ref, {p.B, p.H, p.Nq}, fopts).copy_(at::logsumexp(s, -1));
  });
  return error;
}

namespace {

// A broadcast operand as a torch tensor of H query heads, expanded (stride 0)
// to [B, H, Nq, Nk].
at::Tensor operand_tensor(const BroadcastOperand& x, at::ScalarType type, const DynamicMaskProblem& p) {
  const auto opts = at::TensorOptions().dtype(type).device(at::kCUDA, current_device());
  at::Tensor t = at::from_blob(const_cast<void*>(x.data), {x.b, x.h, x.q, p.Nk}, opts);
  if (x.h > 1 && x.h != p.H) t = t.repeat_interleave(p.H / x.h, 1);  // operand of Hkv heads
  return t.expand({p.B, p.H, p.Nq, p.Nk});
}

// The torch rows of a dynamic-mask problem: which call each makes.
enum class MaskedCall { kEfficient, kCudnn, kUnfused, kDefault, kFlash };

// One forward of `call` on q [B,H,Nq,D], k, v (of H heads): given the
// additive mask `bias`, or plain with torch's causal flag `is_causal` (torch(unfused)
// plain: our bottom-right rule, `bottom_right`). `grad`: in a graph that
// takes gradients (out-of-place ops, the LSE the backward needs).
at::Tensor masked_call(MaskedCall call, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& bias, bool is_causal, bool bottom_right, double scale,
                       bool grad) {
  switch (call) {
    case MaskedCall::kEfficient:
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q, k, v, bias, grad, 0.0, is_causal, scale));
    case MaskedCall::kCudnn:
      return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, bias, grad, 0.0, is_causal, false, scale));
    case MaskedCall::kDefault:  // the public entry point: whatever backend torch picks
      return at::scaled_dot_product_attention(q, k, v, bias, 0.0, is_causal, scale);
    case MaskedCall::kFlash:
      return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, false, scale));
    case MaskedCall::kUnfused: {
      at::Tensor s = at::matmul(q, k.transpose(-2, -1));
      s = grad ? s.mul(scale) : s.mul_(scale);
      if (bias) s = grad ? s.add(*bias) : s.add_(*bias);
      else if (bottom_right) s.masked_fill_(causal_mask(q.size(2), k.size(2)), -std::numeric_limits<float>::infinity());
      return at::matmul(at::softmax(s, -1), v);
    }
  }
  return {};
}

}  // namespace

std::vector<MaskedTorchPeer> make_masked_torch_peers(const DynamicMaskProblem& p, const void* q, const void* k,
                                                     const void* v, std::string* setup_error, const void* dout,
                                                     bool fa2_reference) {
  setup_error->clear();
  // Given the mask and bias as one additive float mask, or (with neither) plain attention.
  const bool has_mask = p.mask.data != nullptr || p.bias.data != nullptr;
  struct Row {
    std::string name;
    MaskedCall call;
    bool masked;  // given the additive mask
    std::string about;
  };
  const std::string sol = "the same Q, K, V without the mask or bias: the dense speed of light at this shape";
  std::vector<Row> rows;
  if (has_mask) {
    rows = {{"sdpa(efficient)+mask", MaskedCall::kEfficient, true, ""},
            {"sdpa(cudnn)+mask", MaskedCall::kCudnn, true, ""},
            {"torch(unfused)+mask", MaskedCall::kUnfused, true, ""},
            {"sdpa(default)+mask", MaskedCall::kDefault, true, ""},
            {"sdpa(cudnn) (no mask: dense speed of light)", MaskedCall::kCudnn, false, sol}};
  } else {
    rows = {{"sdpa(flash)", MaskedCall::kFlash, false, ""},
            {"sdpa(efficient)", MaskedCall::kEfficient, false, ""},
            {"sdpa(cudnn)", MaskedCall::kCudnn, false, ""},
            {"torch(unfused)", MaskedCall::kUnfused, false, ""},
            {"sdpa(default)", MaskedCall::kDefault, false, ""}};
  }
  if (dout != nullptr) {
    for (Row& r : rows) {  // "sdpa(cudnn) bwd (no mask: ...)", "sdpa(flash) bwd"
      const size_t paren = r.name.find(" (");
      r.name = paren == std::string::npos ? r.name + " bwd" : r.name.substr(0, paren) + " bwd" + r.name.substr(paren);
    }
    if (has_mask && fa2_reference)
      rows.push_back({"sdpa(flash) bwd, no mask", MaskedCall::kFlash, false,
                      "FA2 on the same Q, K, V, dO without mask or bias: the dense reference"});
  }

  struct State {
    at::Tensor q, k, v;
    std::optional<at::Tensor> additive;       // with a mask or bias
    at::Tensor q_leaf, k_leaf, v_leaf, dout;  // backward: leaves that take gradients
    std::vector<at::Tensor> out;              // backward: each row's forward graph, built once
    std::string default_backend[2];           // what scaled_dot_product_attention picks, plain / masked
  };
  auto st = std::make_shared<State>();
  st->out.resize(rows.size());
  try {
    const auto t = scalar_type(p.dtype);
    st->q = wrap(q, {p.B, p.H, p.Nq, p.D}, t);
    st->k = wrap(k, {p.B, p.Hkv, p.Nk, p.D}, t);
    st->v = wrap(v, {p.B, p.Hkv, p.Nk, p.D}, t);
    if (p.Hkv != p.H) {
      st->k = st->k.repeat_interleave(p.H / p.Hkv, 1);
      st->v = st->v.repeat_interleave(p.H / p.Hkv, 1);
    }
    if (has_mask) {
      const auto opts = at::TensorOptions().dtype(t).device(at::kCUDA, current_device());
      at::Tensor add = at::zeros({p.B, p.H, p.Nq, p.Nk}, opts);
      if (p.bias.data) add.add_(operand_tensor(p.bias, t, p));
      const float neg_inf = -std::numeric_limits<float>::infinity();
      if (p.mask.data) add.masked_fill_(operand_tensor(p.mask, at::kByte, p) == 0, neg_inf);
      if (p.causal) add.masked_fill_(causal_mask(p.Nq, p.Nk), neg_inf);
      st->additive = add;
    }
    // The backend torch's public entry point picks for these inputs (the
    // sdpa(default) row runs that entry point): aten::_fused_sdp_choice, whose
    // values are sdp::SDPBackend's.
    static const char* const kBackends[] = {"math", "flash", "efficient", "cudnn", "overrideable"};
    for (int masked = 0; masked < 2; ++masked) {
      if (masked && !has_mask) continue;
      const int64_t choice = at::_fused_sdp_choice(st->q, st->k, st->v, masked ? st->additive : std::nullopt, 0.0,
                                                   masked ? false : p.causal, double(p.scale));
      st->default_backend[masked] = choice >= 0 && choice < 5 ? kBackends[choice] : "none";
    }
    if (dout != nullptr) {
      st->q_leaf = wrap(q, {p.B, p.H, p.Nq, p.D}, t).detach().clone().requires_grad_(true);
      st->k_leaf = wrap(k, {p.B, p.Hkv, p.Nk, p.D}, t).detach().clone().requires_grad_(true);
      st->v_leaf = wrap(v, {p.B, p.Hkv, p.Nk, p.D}, t).detach().clone().requires_grad_(true);
      st->dout = wrap(dout, {p.B, p.H, p.Nq, p.D}, t);
    }
    cudaDeviceSynchronize();
  } catch (const c10::Error& e) {
    *setup_error = first_line(e.what_without_backtrace());
    return {};
  }

  const double scale = p.scale;
  const bool softcap = p.softcap > 0.f, causal = p.causal, top_left_differs = p.causal && p.Nq != p.Nk;
  // The backward: the forward graph is built on the first call (untimed in
  // the harness), then every call is one backward through it (retain_graph),
  // with the gradients of the leaves reset first. GQA: K, V repeated inside
  // the graph, so their gradients sum over the group as ours do.
  const int group = p.H / p.Hkv;
  const bool backward = dout != nullptr;
  std::vector<MaskedTorchPeer> peers;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row row = rows[i];
    MaskedTorchPeer peer;
    peer.name = row.name;
    peer.masked = row.masked;
    peer.about = row.about;
    if (row.call == MaskedCall::kDefault) peer.about = "torch picks " + st->default_backend[row.masked ? 1 : 0];
    peer.run = [st, row, i, scale, softcap, causal, top_left_differs, group, backward](cudaStream_t stream) {
      if (softcap) return std::string("torch SDPA has no softcap");
      // A plain SDPA row is causal by torch's flag: it cannot say bottom-right.
      if (!row.masked && top_left_differs && row.call != MaskedCall::kUnfused)
        return std::string("torch's is_causal is top-left aligned when Nq != Nk (attnlab: bottom-right)");
      const std::optional<at::Tensor> bias = row.masked ? st->additive : std::nullopt;
      const bool is_causal = !row.masked && causal;
      std::string err;
      on_stream(stream, &err, [&] {
        if (!backward) {
          masked_call(row.call, st->q, st->k, st->v, bias, is_causal, is_causal, scale, false);
          return;
        }
        if (!st->out[i].defined()) {
          const at::Tensor kh = group > 1 ? st->k_leaf.repeat_interleave(group, 1) : st->k_leaf;
          const at::Tensor vh = group > 1 ? st->v_leaf.repeat_interleave(group, 1) : st->v_leaf;
          st->out[i] = masked_call(row.call, st->q_leaf, kh, vh, bias, is_causal, is_causal, scale, true);
        }
        for (at::Tensor* leaf : {&st->q_leaf, &st->k_leaf, &st->v_leaf})
          if (leaf->grad().defined()) leaf->mutable_grad().zero_();
        st->out[i].backward(st->dout, /*retain_graph=*/true);
      });
      return err;
    };
    peers.push_back(peer);
  }
  return peers;
}

}  // namespace attnlab
