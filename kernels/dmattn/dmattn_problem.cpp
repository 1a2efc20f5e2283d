// attnlab: dynamic-mask attention — the host side of the problem
// description: broadcast operand shapes and strides, the dense view, names.
#include <cstdio>

#include "dmattn/dmattn.h"

namespace attnlab {

// Dense strides of a ({B|1}, {H|Hkv|1}, {Nq|1}, Nk) operand: a size-1 dimension
// gets stride 0, so indexing with the full (b, h / head_group, i) reads the
// broadcast element. Nothing is validated here (the launchers do).
void BroadcastOperand::set_shape(int b_, int h_, int q_, int Nk, int H) {
  b = b_;
  h = h_;
  q = q_;
  stride_q = q > 1 ? int64_t(Nk) : 0;
  stride_h = h > 1 ? int64_t(q) * Nk : 0;
  stride_b = b > 1 ? int64_t(h) * q * Nk : 0;
  head_group = h > 1 ? H / h : 1;  // h == H: 1; h == Hkv: H / Hkv
}

std::string BroadcastOperand::shape_string(int Nk) const {
  return "(" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(q) + ", " + std::to_string(Nk) +
         ")";
}

// "B=1, H=8, Hkv=2, N=8192, D=64, fp16, causal, mask (1, 8, 1, 8192), bias (1, 2, 8192, 8192), softcap 30":
// the dense problem's string (Hkv only when it differs from H), then what is present.
std::string DynamicMaskProblem::shape_string() const {
  std::string s = dense().shape_string();
  if (mask.data) s += ", mask " + mask.shape_string(Nk) + (mask_format == DmaMaskFormat::kBits ? " bits" : "");
  if (bias.data) s += ", bias " + bias.shape_string(Nk);
  if (softcap > 0.f) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), ", softcap %g", double(softcap));
    s += buf;
  }
  return s;
}

size_t dma_mask_bits_bytes(const DynamicMaskProblem& p) {
  if (p.mask.data == nullptr) return 0;
  return size_t(p.mask.b) * p.mask.h * p.mask.q * size_t(dma_mask_bit_row_words(p.Nk)) * sizeof(uint32_t);
}

std::string dma_mask_bits_unsupported(const DynamicMaskProblem& p) {
  if (p.mask.data == nullptr || p.mask_format != DmaMaskFormat::kBits) return "";
  if (reinterpret_cast<uintptr_t>(p.mask.data) % 8 != 0) return "a bit-packed mask must be 8-byte aligned";
  if (p.mask.stride_b % 2 != 0 || p.mask.stride_h % 2 != 0 || p.mask.stride_q % 2 != 0)
    return "a bit-packed mask's strides must be even word counts (rows of whole 64-key tiles)";
  if (p.mask.q != 1 && p.mask.stride_q < dma_mask_bit_row_words(p.Nk))
    return "a bit-packed mask's rows hold dma_mask_bit_row_words(Nk) words";
  return "";
}

DynamicMaskProblem dma_with_bit_mask(const DynamicMaskProblem& p, const uint32_t* bits) {
  DynamicMaskProblem out = p;
  out.mask.data = bits;
  out.mask_format = DmaMaskFormat::kBits;
  // set_shape's dense strides with a row of dma_mask_bit_row_words(Nk) words
  out.mask.set_shape(p.mask.b, p.mask.h, p.mask.q, int(dma_mask_bit_row_words(p.Nk)), p.H);
  return out;
}

}  // namespace attnlab
