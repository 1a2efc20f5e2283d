// attnlab: softcap (Gemma 2; FlashAttention's `softcap`): a logit s becomes
// s' = C·tanh(s / C), bounded to (−C, C), and ds'/ds = 1 − tanh²(s / C). The one
// definition the kernels apply: the block-sparse score_mod (blocksparse/mods.h)
// and the dynamic-mask forward, decode and backward kernels. Host and device;
// the references (kernels/reference/, dmattn_reference.cu) spell it out on
// their own.
#pragma once

#include <cmath>

#include "host/attn_problem.h"  // ATTNLAB_HOST_DEVICE

namespace attnlab {

// s' = C·tanh(s / C).
ATTNLAB_HOST_DEVICE inline float apply_softcap(float s, float cap) { return cap * tanhf(s / cap); }
// The same with 1/C precomputed, a multiplication in place of the division:
// for kernels that cap every score of a tile (the dynamic-mask forward and
// decode kernels; the rounding may differ from the division's by an ulp).
ATTNLAB_HOST_DEVICE inline float apply_softcap(float s, float cap, float inv_cap) { return cap * tanhf(s * inv_cap); }

// ds'/ds at the score s (before the cap).
ATTNLAB_HOST_DEVICE inline float softcap_grad(float s, float cap) {
  const float th = tanhf(s / cap);
  return 1.f - th * th;
}
// The same through the capped score s' (tanh(s / C) = s' / C), for a backward
// that holds s' rather than s.
ATTNLAB_HOST_DEVICE inline float softcap_grad_from_output(float s_mod, float cap) {
  const float th = s_mod / cap;
  return 1.f - th * th;
}

}  // namespace attnlab
