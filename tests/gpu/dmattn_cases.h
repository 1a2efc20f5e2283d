// attnlab: one dynamic-mask test case for the backward tests — its shape, the
// broadcast forms of its mask and bias, and its random inputs, built the same
// way for the CPU double reference (MaskedProblem) and the GPU (DynamicMaskProblem).
#pragma once

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dmattn/dmattn.h"
#include "reference/masked_reference_cpu.h"
#include "gpu_testing.h"

namespace attnlab::testing {

struct MaskedCase {
  int B, H, Hkv, Nq, Nk, D;
  DType dtype;
  bool causal;
  float softcap;
  int mb, mh, mq;  // mask sizes (mh: 0 = H, -1 = Hkv, 1 = 1); mb = 0: no mask
  int bb, bh, bq;  // bias sizes (bh as mh); bb = 0: no bias
  bool zero_rows;  // every third mask row all zero (only with mq > 1)

  int heads_of(int code) const { return code == 0 ? H : code == -1 ? Hkv : 1; }
  std::string name() const {
    char buf[200];
    std::snprintf(buf, sizeof buf, "B=%d H=%d Hkv=%d Nq=%d Nk=%d D=%d %s%s%s mask(%d,%d,%d) bias(%d,%d,%d)%s", B, H,
                  Hkv, Nq, Nk, D, dtype == DType::kFloat16 ? "fp16" : "bf16", causal ? " causal" : "",
                  softcap > 0 ? " softcap" : "", mb, mh, mq, bb, bh, bq, zero_rows ? " zero-rows" : "");
    return buf;
  }
};

// The inputs of a case: Q, K, V, dO (normal, in the dtype), bias (sd 2), a
// random half-dense mask; the same values on both sides. Owns the device mask
// and bias that p points to.
struct MaskedCaseInputs {
  DynamicMaskProblem p;
  MaskedProblem mp;
  MaskedInputs in;
  std::vector<uint16_t> qb, kb, vb, db, bb;
  std::vector<double> dout;
  void* d_bias = nullptr;
  uint8_t* d_mask = nullptr;

  MaskedCaseInputs(const MaskedCase& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    p.B = c.B; p.H = c.H; p.Hkv = c.Hkv; p.Nq = c.Nq; p.Nk = c.Nk; p.D = c.D;
    p.dtype = c.dtype;
    p.causal = c.causal;
    p.scale = 1.0f / std::sqrt(float(c.D));
    p.softcap = c.softcap;
    mp.B = c.B; mp.H = c.H; mp.Hkv = c.Hkv; mp.Nq = c.Nq; mp.Nk = c.Nk; mp.D = mp.Dv = c.D;
    mp.causal = c.causal;
    mp.scale = p.scale;
    mp.softcap = c.softcap;
    random_tensor(rng, int64_t(c.B) * c.H * c.Nq * c.D, c.dtype, 1.0, qb, in.q);
    random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, c.dtype, 1.0, kb, in.k);
    random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, c.dtype, 1.0, vb, in.v);
    random_tensor(rng, int64_t(c.B) * c.H * c.Nq * c.D, c.dtype, 1.0, db, dout);
    if (c.bb > 0) {
      mp.has_bias = true;
      mp.bias_shape = {c.bb, c.heads_of(c.bh), c.bq, c.Nk};
      random_tensor(rng, mp.bias_shape.elems(), c.dtype, 2.0, bb, in.bias);
      d_bias = upload(bb);
      p.bias.data = d_bias;
      p.bias.set_shape(c.bb, c.heads_of(c.bh), c.bq, c.Nk, c.H);
    }
    if (c.mb > 0) {
      mp.has_mask = true;
      mp.mask_shape = {c.mb, c.heads_of(c.mh), c.mq, c.Nk};
      in.mask.resize(size_t(mp.mask_shape.elems()));
      std::bernoulli_distribution keep(0.5);
      for (auto& m : in.mask) m = keep(rng) ? 1 : 0;
      if (c.zero_rows && c.mq > 1)
        for (int64_t r = 0; r < mp.mask_shape.elems() / c.Nk; r += 3)
          std::fill(in.mask.begin() + r * c.Nk, in.mask.begin() + (r + 1) * c.Nk, 0);
      d_mask = upload(in.mask);
      p.mask.data = d_mask;
      p.mask.set_shape(c.mb, c.heads_of(c.mh), c.mq, c.Nk, c.H);
    }
  }
  ~MaskedCaseInputs() {
    if (d_bias) cudaFree(d_bias);
    if (d_mask) cudaFree(d_mask);
  }
  MaskedCaseInputs(const MaskedCaseInputs&) = delete;
  MaskedCaseInputs& operator=(const MaskedCaseInputs&) = delete;
};

}  // namespace attnlab::testing
