// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the problem every kernel solves, and the buffers it solves it in.
//
//   O = softmax(scale · Q·Kᵀ + mask) · V          per (batch, head)
//   Q: [B, H, Nq, D]   K: [B, Hkv, Nk, D]   V: [B, Hkv, Nk, Dv]   O: [B, H, Nq, Dv]
//   GQA/MQA: H a multiple of Hkv; query head h reads KV head h / (H / Hkv).
//   LSE: [B, H, Nq] fp32, natural log of each row's softmax denominator
//        (-inf for a row that sees no key: its O row is 0).
//
// Causal masking is bottom-right aligned, as in FlashAttention when Nq != Nk:
// query i sees key j  iff  j <= i + (Nk - Nq).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#ifdef __CUDACC__
#define ATTNLAB_HOST_DEVICE __host__ __device__
#else
#define ATTNLAB_HOST_DEVICE
#endif

namespace attnlab {

enum class DType { kFloat16, kBFloat16 };

inline const char* dtype_name(DType t) { return t == DType::kFloat16 ? "fp16" : "bf16"; }
constexpr size_t kInputElementBytes = 2;  // fp16 and bf16 are both 2 bytes

struct AttnProblem {
  int B = 1;
  int H = 1;
  int Hkv = 0;  // KV heads; 0 means H (no GQA)
  int Nq = 1;
  int Nk = 1;
  int D = 64;   // head dim of Q and K
  int Dv = 64;  // head dim of V and O
  DType dtype = DType::kFloat16;
  bool causal = false;
  float scale = 0.125f;  // softmax scale, usually 1/sqrt(D)

  int64_t heads() const { return int64_t(B) * H; }
  ATTNLAB_HOST_DEVICE int kv_heads() const { return Hkv > 0 ? Hkv : H; }
  bool gqa() const { return kv_heads() != H; }
  // The KV head that query head `head` (b·H + h, the index of Q's [B, H] planes)
  // reads: b·Hkv + h / g with g = H / Hkv query heads per KV head, which is
  // head / g, since b·H + h = (b·Hkv + h / g)·g + h % g. In 32 bits (a 64-bit
  // division costs a kernel registers): B·H <= 65535² < 2^32, the grid limit.
  ATTNLAB_HOST_DEVICE int64_t kv_head(int64_t head) const {
    return uint32_t(head) / uint32_t(H / kv_heads());
  }
  int64_t q_elems() const { return heads() * Nq * D; }
  int64_t k_elems() const { return int64_t(B) * kv_heads() * Nk * D; }
  int64_t v_elems() const { return int64_t(B) * kv_heads() * Nk * Dv; }
  int64_t o_elems() const { return heads() * Nq * Dv; }
  int64_t lse_elems() const { return heads() * Nq; }
  std::string shape_string() const;  // "B=1, H=8, Nq=Nk=8192, D=64, fp16, causal"
};

inline float default_scale(int D) { return 1.0f / std::sqrt(float(D)); }

// Number of keys query row i may attend to (0 for a fully masked row).
ATTNLAB_HOST_DEVICE inline int64_t visible_keys(int64_t i, const AttnProblem& p) {
  if (!p.causal) return p.Nk;
  const int64_t last = i + (int64_t(p.Nk) - p.Nq);  // last visible key index
  if (last < 0) return 0;
  return last + 1 < p.Nk ? last + 1 : p.Nk;
}

// min and max of two ints on the host and the device (there CUDA's own, which
// the kernels below were tuned with: a ternary compiles to other code).
ATTNLAB_HOST_DEVICE inline int min_int(int a, int b) {
#if defined(__CUDA_ARCH__)
  return min(a, b);
#else
  return a < b ? a : b;
#endif
}
ATTNLAB_HOST_DEVICE inline int max_int(int a, int b) {
#if defined(__CUDA_ARCH__)
  return max(a, b);
#else
  return a > b ? a : b;
#endif
}

// How many Bc-wide KV tiles the query tile [q_start, q_start + Br) needs: all of
// them, or under a causal mask only up to the last key its last row sees.
ATTNLAB_HOST_DEVICE inline int kv_tiles_for_query_tile(const AttnProblem& p, int q_start, int Br, int Bc) {
  int n = (p.Nk + Bc - 1) / Bc;
  if (p.causal) {
    const int q_end = min_int(q_start + Br, p.Nq);
    n = min_int(n, max_int(0, (q_end + (p.Nk - p.Nq) + Bc - 1) / Bc));
  }
  return n;
}

// Exact number of unmasked (query, key) pairs in one head.
int64_t unmasked_pairs_per_head(const AttnProblem& p);

// The project's one FLOP convention (see README): 2·B·H·(D+Dv)·pairs forward,
// 2·B·H·(3D+2Dv)·pairs backward.
double forward_flops(const AttnProblem& p);
double backward_flops(const AttnProblem& p);

// Device pointers. The harness owns every allocation; a kernel that needs scratch
// space declares it through Variant::workspace_bytes and gets it here.
struct AttnBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// The backward of L = Σ O ⊙ dO: the forward's inputs and outputs (O in the
// input dtype, LSE as the forward wrote it) and dO in; dQ, dK, dV out, in the
// input dtype and the shapes of Q, K, V (dK, dV summed over the H / Hkv query
// heads that share a KV head). A row that sees no key contributes nothing.
struct AttnGradBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;     // [B, H, Nq, Dv]
  const float* lse = nullptr;  // [B, H, Nq]
  const void* dout = nullptr;  // [B, H, Nq, Dv]
  void* dq = nullptr;          // [B, H, Nq, D]
  void* dk = nullptr;          // [B, Hkv, Nk, D]
  void* dv = nullptr;          // [B, Hkv, Nk, Dv]
  void* workspace = nullptr;   // BwdVariant::workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
};

}  // namespace attnlab
