// attnlab: CPU double-precision reference of dynamic-mask attention (flash-dmattn
// semantics) — forward, backward, the top-W mask builder. For tests.
//
//   Q: [B, H, Nq, D]   K: [B, Hkv, Nk, D]   V: [B, Hkv, Nk, Dv]   (H % Hkv == 0:
//   query head h reads KV head h / (H / Hkv))
//   mask (0/1) and bias: broadcastable ({B|1}, {H|Hkv|1}, {Nq|1}, Nk), stored
//   densely in their own shape (a size-1 dimension is read with stride 0).
//   S = scale·Q·Kᵀ + bias;  with softcap c > 0: S = c·tanh(S / c);
//   S = -inf where mask == 0 or the causal rule (bottom-right aligned) excludes
//   the pair; O = softmax(S)·V; LSE natural log. A row that sees no key gives
//   O = 0, LSE = -inf and contributes nothing to any gradient.
#pragma once

#include <cstdint>
#include <vector>

namespace attnlab {

// Sizes of a broadcastable operand; each of b, h, q is the full size or 1.
struct BroadcastShape {
  int b = 1, h = 1, q = 1, k = 1;
  int64_t elems() const { return int64_t(b) * h * q * k; }
};

struct MaskedProblem {
  int B = 1, H = 1, Hkv = 1, Nq = 1, Nk = 1, D = 16, Dv = 16;
  bool causal = false;
  double scale = 0.25;
  double softcap = 0;  // 0: off
  bool has_mask = false, has_bias = false;
  BroadcastShape mask_shape, bias_shape;

  // Offset of (b, h, i, j) in a broadcast operand of `shape` (h a query head).
  int64_t offset(const BroadcastShape& shape, int b, int h, int i, int j) const;
  // Whether query row i may see key j (causal rule and mask only; bias aside).
  bool visible(int b, int h, int i, int j, const std::vector<uint8_t>& mask) const;
};

struct MaskedInputs {
  std::vector<double> q, k, v;  // [B,H,Nq,D], [B,Hkv,Nk,D], [B,Hkv,Nk,Dv]
  std::vector<uint8_t> mask;    // mask_shape, 0 = masked (empty when !has_mask)
  std::vector<double> bias;     // bias_shape (empty when !has_bias)
};

struct MaskedGrads {
  std::vector<double> dq, dk, dv;  // shapes of q, k, v
  std::vector<double> dbias;       // bias_shape: summed over the broadcast dimensions
};

void masked_attention_forward_cpu(const MaskedProblem& p, const MaskedInputs& in, std::vector<double>& o,
                                  std::vector<double>& lse);

// Gradients of L = Σ O ⊙ dO.
void masked_attention_backward_cpu(const MaskedProblem& p, const MaskedInputs& in, const std::vector<double>& dout,
                                   MaskedGrads& grads);

// flash-dmattn's dynamic mask: for every query, keep the `window` keys with the
// largest bias among those the causal rule allows (ties: the lower key index).
// With block_size > 0, then smooth per key block: a block is kept whole (its
// causally allowed keys) when more than half of its keys were kept, else
// dropped. Returns a mask of shape (bias b, bias h, Nq, Nk).
std::vector<uint8_t> build_topk_mask_cpu(const MaskedProblem& p, const std::vector<double>& bias, int window,
                                         int block_size);

// Exact number of (query, key) pairs that are not masked, over all B·H heads.
int64_t masked_unmasked_pairs(const MaskedProblem& p, const std::vector<uint8_t>& mask);

// The bit-packed form of a dense byte mask of `rows` rows of Nk keys, as
// dma_pack_mask_bits writes it (dmattn.h, DmaMaskFormat::kBits): rows of
// 2·ceil(Nk / 64) 32-bit words, bit k % 32 of word k / 32 set where byte k is
// nonzero, padding bits 0. The reference the GPU packer is tested against.
std::vector<uint32_t> pack_mask_bits_cpu(const std::vector<uint8_t>& mask, int64_t rows, int Nk);

}  // namespace attnlab
