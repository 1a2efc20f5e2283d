// attnlab: dynamic-mask attention — the host side of the problem
// description: the dense view, names.
#include <cstdio>

#include "dmattn/dmattn.h"

namespace attnlab {

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
