// The variable-length forward (kernels/varlen/varlen.h) against a CPU
// reference per sequence, on fresh normal inputs per case: each sequence's O
// rows and LSE against the double-precision reference of that sequence alone
// (kernels/reference/mods_reference.h, mods_attention_cpu with no mask_mod or
// the bottom-right causal one), held to the project's rule (reference.h,
// judge): max|O - O_ref| <= 2·(the same-precision error) + 2·(rounding of
// O_ref to the dtype), |LSE - LSE_ref| <= kLseTolerance, nothing NaN or
// unwritten (O and LSE are poisoned with NaN first). Rows that see no key hold
// O = 0, LSE = -inf exactly; rows of other sequences are never written (each
// sequence is checked with its neighbours' rows poisoned). The prepare
// kernel's order is compared with the host's (varlen_tile_order), item count
// included.
// Cases: one sequence of 1, 17, 129 rows; sequences of length 0 among others;
// lengths 127, 129, 1000 together; keys and queries of different lengths per
// sequence (causal rows that see no key); one long sequence among short ones;
// 37 random lengths; every head-dim config, both dtypes, MHA / GQA / MQA,
// causal and not; a negative control (a sequence's K changed after the run
// must fail). The backward ("bwd" cases): dQ, dK, dV into poisoned buffers,
// each gradient of each sequence on its own against the fp32 GPU reference
// backward of that sequence and its same-precision path; sequences without
// queries or keys must have zero gradients. Options: gpu_testing.h's CaseArgs
// (-v, --only TEXT).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "blocksparse/mods.h"
#include "gpu_testing.h"
#include "host/device.h"
#include "host/launch.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"
#include "varlen/varlen.h"
#include "varlen/varlen_schedule.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

CaseArgs args;

struct Case {
  std::vector<int> len_q, len_k;  // per sequence
  int H, Hkv, D, Dv;
  DType dtype;
  bool causal;
  bool corrupt = false;  // negative control: sequence 0's K changed after the run; must fail
  bool bwd = false;      // the backward's case: dQ, dK, dV
  std::string name() const {
    std::string s = bwd ? "bwd lengths" : "lengths";
    for (size_t b = 0; b < len_q.size() && b < 6; ++b)
      s += (b ? "," : " ") + std::to_string(len_q[b]) + (len_k[b] != len_q[b] ? "/" + std::to_string(len_k[b]) : "");
    if (len_q.size() > 6) s += ",... (" + std::to_string(len_q.size()) + " sequences)";
    s += " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D);
    if (Dv != D) s += " Dv=" + std::to_string(Dv);
    return s + " " + dtype_name(dtype) + (causal ? " causal" : "") + (corrupt ? " (negative control)" : "");
  }
};

std::vector<int> offsets(const std::vector<int>& lengths) {
  std::vector<int> cu(1, 0);
  for (int n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

// Rows [r0, r0 + len) of a packed [total, heads, cols] tensor as a dense [heads, len, cols] one.
std::vector<double> unpack(const std::vector<double>& packed, int heads, int cols, int r0, int len) {
  std::vector<double> dense(size_t(heads) * len * cols);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < len; ++i)
      for (int c = 0; c < cols; ++c)
        dense[(size_t(h) * len + i) * cols + c] = packed[(size_t(r0 + i) * heads + h) * cols + c];
  return dense;
}

// A device copy of `host` owned by `mem` (nullptr when out of memory).
template <typename T>
T* upload_to(DeviceBuffers& mem, const std::vector<T>& host) {
  T* dev = mem.alloc<T>(host.size() * sizeof(T));
  if (dev != nullptr && !host.empty()) cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return dev;
}

// The same for 16-bit values.
std::vector<uint16_t> unpack_bits(const std::vector<uint16_t>& packed, int heads, int cols, int r0, int len) {
  std::vector<uint16_t> dense(size_t(heads) * len * cols);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < len; ++i)
      for (int c = 0; c < cols; ++c)
        dense[(size_t(h) * len + i) * cols + c] = packed[(size_t(r0 + i) * heads + h) * cols + c];
  return dense;
}

bool run_backward_case(const Case& c, std::mt19937_64& rng);

bool run_case(const Case& c, std::mt19937_64& rng) {
  if (c.bwd) return run_backward_case(c, rng);
  const int B = int(c.len_q.size());
  const std::vector<int> cu_q = offsets(c.len_q), cu_k = offsets(c.len_k);
  VarlenProblem vp;
  AttnProblem& p = vp.shape;
  p.B = B, p.H = c.H, p.Hkv = c.Hkv, p.D = c.D, p.Dv = c.Dv, p.dtype = c.dtype, p.causal = c.causal;
  p.scale = default_scale(c.D);
  p.Nq = std::max(1, *std::max_element(c.len_q.begin(), c.len_q.end()));
  p.Nk = std::max(1, *std::max_element(c.len_k.begin(), c.len_k.end()));
  vp.total_q = cu_q.back(), vp.total_k = cu_k.back();
  if (std::string why = varlen_lengths_invalid(vp, cu_q, cu_k); !why.empty()) {
    record(false, c.name() + ": the case's lengths: " + why);
    return true;
  }
  if (std::string why = varlen_fwd_unsupported(vp); !why.empty()) {
    record(false, c.name() + ": refused: " + why);
    return true;
  }

  std::vector<uint16_t> qb, kb, vb;
  std::vector<double> qv, kv, vv;
  random_tensor(rng, int64_t(vp.total_q) * p.H * p.D, p.dtype, 1.0, qb, qv);
  random_tensor(rng, int64_t(vp.total_k) * p.Hkv * p.D, p.dtype, 1.0, kb, kv);
  random_tensor(rng, int64_t(vp.total_k) * p.Hkv * p.Dv, p.dtype, 1.0, vb, vv);
  const int64_t o_elems = int64_t(vp.total_q) * p.H * p.Dv, lse_elems = int64_t(p.H) * vp.total_q;

  DeviceBuffers mem;
  VarlenBuffers b;
  auto* q = mem.alloc<uint16_t>(qb.size() * 2);
  auto* k = mem.alloc<uint16_t>(kb.size() * 2);
  auto* v = mem.alloc<uint16_t>(vb.size() * 2);
  auto* dcu_q = mem.alloc<int>(cu_q.size() * sizeof(int));
  auto* dcu_k = mem.alloc<int>(cu_k.size() * sizeof(int));
  auto* o = mem.alloc<uint16_t>(size_t(o_elems) * 2);
  auto* lse = mem.alloc<float>(size_t(lse_elems) * 4);
  const size_t ws_bytes = varlen_fwd_workspace_bytes(vp);
  void* ws = mem.alloc<char>(ws_bytes);
  if (!q || !k || !v || !dcu_q || !dcu_k || !o || !lse || !ws) {
    record(false, c.name() + ": out of device memory");
    return true;
  }
  cudaMemcpy(q, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(k, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(v, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dcu_q, cu_q.data(), cu_q.size() * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemcpy(dcu_k, cu_k.data(), cu_k.size() * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemset(o, 0xFF, size_t(o_elems) * 2);  // NaN: a row left unwritten fails
  cudaMemset(lse, 0xFF, size_t(lse_elems) * 4);
  b.q = q, b.k = k, b.v = v, b.cu_seqlens_q = dcu_q, b.cu_seqlens_k = dcu_k, b.o = o, b.lse = lse;
  b.workspace = ws, b.workspace_bytes = ws_bytes;
  cudaError_t err = varlen_fwd(vp, b, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    const std::string why = launch_detail().empty() ? cudaGetErrorString(err) : launch_detail();
    record(false, c.name() + ": launch: " + why);
    return gpu_still_usable(why);
  }
  std::vector<uint16_t> ob(static_cast<size_t>(o_elems));
  std::vector<float> lse_h(static_cast<size_t>(lse_elems));
  cudaMemcpy(ob.data(), o, ob.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse_h.data(), lse, lse_h.size() * 4, cudaMemcpyDeviceToHost);

  bool ok = true;
  std::string worst;
  // The order: the prepare kernel's against the host's.
  if (!c.corrupt) {
    const VarlenWorkspace w = VarlenWorkspace::at(ws, B);
    int n_items = -1;
    cudaMemcpy(&n_items, w.n_items, sizeof(int), cudaMemcpyDeviceToHost);
    int Br = 0, Bc = 0;
    varlen_fwd_tile(p.D, p.Dv, &Br, &Bc);
    const std::vector<VarlenTile> want = varlen_tile_order(VarlenTiles::kQuery, p, cu_q.data(), cu_k.data(), B, vp.total_q, vp.total_k, Br, Bc);
    std::vector<VarlenTile> got(want.size());
    if (!got.empty()) cudaMemcpy(got.data(), w.tiles, got.size() * sizeof(VarlenTile), cudaMemcpyDeviceToHost);
    bool same = n_items == int(want.size()) * p.H;
    for (size_t i = 0; same && i < want.size(); ++i) same = got[i].seq == want[i].seq && got[i].tile == want[i].tile;
    if (!same) {
      ok = false;
      worst = "the prepared order differs from the host's (" + std::to_string(n_items) + " items, want " +
              std::to_string(want.size() * size_t(p.H)) + ")";
    }
  }
  if (c.corrupt && vp.total_k > 0)  // the reference sees other keys than the kernel did
    for (size_t i = 0; i < size_t(c.len_k[0]) * p.Hkv * p.D; ++i) kv[i] = -kv[i];

  std::string why;
  const MaskMod mask_none{};
  for (int s = 0; s < B && ok; ++s) {
    const VarlenSeq seq = varlen_seq(cu_q.data(), cu_k.data(), s, vp.total_q, vp.total_k);
    if (seq.len_q == 0) continue;
    const AttnProblem ps = varlen_seq_problem(p, seq);
    std::vector<double> o_ref, lse_ref, o_low;
    if (seq.len_k > 0) {
      MaskMod mask = mask_none;
      if (c.causal) mask = parse_mask_mod("causal", ps.Nq, ps.Nk, why);
      mods_attention_cpu(ps, mask, ScoreMod{}, unpack(qv, p.H, p.D, seq.q0, seq.len_q),
                         unpack(kv, p.Hkv, p.D, seq.k0, seq.len_k), unpack(vv, p.Hkv, p.Dv, seq.k0, seq.len_k), o_ref,
                         lse_ref, o_low);
    } else {  // no keys: every row O = 0, LSE = -inf
      o_ref.assign(size_t(p.H) * seq.len_q * p.Dv, 0.0);
      o_low = o_ref;
      lse_ref.assign(size_t(p.H) * seq.len_q, -std::numeric_limits<double>::infinity());
    }
    // Our rows of this sequence, dense [H, len_q, Dv] and [H, len_q].
    std::vector<uint16_t> o_seq(o_ref.size());
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < seq.len_q; ++i)
        for (int d = 0; d < p.Dv; ++d)
          o_seq[(size_t(h) * seq.len_q + i) * p.Dv + d] = ob[(size_t(seq.q0 + i) * p.H + h) * p.Dv + d];
    const OutputComparison oc = compare_output(o_seq, o_ref, o_low, p.dtype);
    ErrorStats ls;
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < seq.len_q; ++i) {
        const double got = lse_h[size_t(h) * vp.total_q + seq.q0 + i], want = lse_ref[size_t(h) * seq.len_q + i];
        if (std::isinf(want)) {
          if (!(std::isinf(got) && got < 0)) ++ls.nonfinite;
        } else if (!std::isfinite(got)) {
          ++ls.nonfinite;
        } else {
          ls.max_abs_err = std::max(ls.max_abs_err, std::fabs(got - want));
        }
      }
    const CheckResult r = judge(oc.stats, ls, oc.baseline_err, oc.rounding_err);
    if (!r.pass) {
      ok = false;
      worst = "sequence " + std::to_string(s) + " (" + std::to_string(seq.len_q) + " x " + std::to_string(seq.len_k) +
              "): " + r.summary();
    }
  }
  if (c.corrupt) record(!ok, c.name() + ": the changed keys went unnoticed");
  else record(ok, c.name() + ": " + worst);
  if (args.verbose && ok != c.corrupt) std::printf("ok   %s\n", c.name().c_str());
  return true;
}

// The backward: our forward's O and LSE, a random dO, then dQ, dK, dV into
// poisoned buffers, each sequence's three gradients held on their own to the
// rule against the fp32 GPU reference of that sequence alone and its
// same-precision path (reference.h, reference_attention_backward_fp32).
bool run_backward_case(const Case& c, std::mt19937_64& rng) {
  const int B = int(c.len_q.size());
  const std::vector<int> cu_q = offsets(c.len_q), cu_k = offsets(c.len_k);
  VarlenProblem vp;
  AttnProblem& p = vp.shape;
  p.B = B, p.H = c.H, p.Hkv = c.Hkv, p.D = c.D, p.Dv = c.Dv, p.dtype = c.dtype, p.causal = c.causal;
  p.scale = default_scale(c.D);
  p.Nq = std::max(1, *std::max_element(c.len_q.begin(), c.len_q.end()));
  p.Nk = std::max(1, *std::max_element(c.len_k.begin(), c.len_k.end()));
  vp.total_q = cu_q.back(), vp.total_k = cu_k.back();
  if (std::string why = varlen_bwd_unsupported(vp); !why.empty()) {
    record(false, c.name() + ": refused: " + why);
    return true;
  }
  std::vector<uint16_t> qb, kb, vb, db;
  std::vector<double> unused;
  random_tensor(rng, int64_t(vp.total_q) * p.H * p.D, p.dtype, 1.0, qb, unused);
  random_tensor(rng, int64_t(vp.total_k) * p.Hkv * p.D, p.dtype, 1.0, kb, unused);
  random_tensor(rng, int64_t(vp.total_k) * p.Hkv * p.Dv, p.dtype, 1.0, vb, unused);
  random_tensor(rng, int64_t(vp.total_q) * p.H * p.Dv, p.dtype, 1.0, db, unused);
  DeviceBuffers mem;
  auto* q = upload_to(mem, qb);
  auto* k = upload_to(mem, kb);
  auto* v = upload_to(mem, vb);
  auto* dout = upload_to(mem, db);
  auto* dcu_q = upload_to(mem, cu_q);
  auto* dcu_k = upload_to(mem, cu_k);
  auto* o = mem.alloc<uint16_t>(db.size() * 2);
  auto* lse = mem.alloc<float>(size_t(p.H) * vp.total_q * 4);
  auto* dq = mem.alloc<uint16_t>(qb.size() * 2);
  auto* dk = mem.alloc<uint16_t>(kb.size() * 2);
  auto* dv = mem.alloc<uint16_t>(vb.size() * 2);
  const size_t ws_bytes = std::max(varlen_fwd_workspace_bytes(vp), varlen_bwd_workspace_bytes(vp));
  void* ws = mem.alloc<char>(ws_bytes);
  if (!q || !k || !v || !dout || !dcu_q || !dcu_k || !o || !lse || !dq || !dk || !dv || !ws) {
    record(false, c.name() + ": out of device memory");
    return true;
  }
  VarlenBuffers f;
  f.q = q, f.k = k, f.v = v, f.cu_seqlens_q = dcu_q, f.cu_seqlens_k = dcu_k, f.o = o, f.lse = lse;
  f.workspace = ws, f.workspace_bytes = ws_bytes;
  VarlenGradBuffers g;
  g.q = q, g.k = k, g.v = v, g.o = o, g.lse = lse, g.dout = dout, g.cu_seqlens_q = dcu_q, g.cu_seqlens_k = dcu_k;
  g.dq = dq, g.dk = dk, g.dv = dv, g.workspace = ws, g.workspace_bytes = ws_bytes;
  cudaMemset(dq, 0xFF, qb.size() * 2);  // NaN: a gradient left unwritten fails
  cudaMemset(dk, 0xFF, kb.size() * 2);
  cudaMemset(dv, 0xFF, vb.size() * 2);
  cudaError_t err = varlen_fwd(vp, f, nullptr);
  if (err == cudaSuccess) err = varlen_bwd(vp, g, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    const std::string why = launch_detail().empty() ? cudaGetErrorString(err) : launch_detail();
    record(false, c.name() + ": launch: " + why);
    return gpu_still_usable(why);
  }
  std::vector<uint16_t> dqb(qb.size()), dkb(kb.size()), dvb(vb.size());
  cudaMemcpy(dqb.data(), dq, dqb.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(dkb.data(), dk, dkb.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(dvb.data(), dv, dvb.size() * 2, cudaMemcpyDeviceToHost);

  std::string worst;
  for (int s = 0; s < B && worst.empty(); ++s) {
    const VarlenSeq seq = varlen_seq(cu_q.data(), cu_k.data(), s, vp.total_q, vp.total_k);
    const AttnProblem ps = varlen_seq_problem(p, seq);
    const std::vector<uint16_t> ours[3] = {unpack_bits(dqb, p.H, p.D, seq.q0, seq.len_q),
                                           unpack_bits(dkb, p.Hkv, p.D, seq.k0, seq.len_k),
                                           unpack_bits(dvb, p.Hkv, p.Dv, seq.k0, seq.len_k)};
    const char* names[3] = {"dQ", "dK", "dV"};
    if (seq.len_q == 0 || seq.len_k == 0) {  // nothing sees anything: every gradient 0
      for (int i = 0; i < 3 && worst.empty(); ++i)
        for (uint16_t x : ours[i])
          if (from_bits(x, p.dtype) != 0.0) {
            worst = "sequence " + std::to_string(s) + ": " + names[i] + " must be 0";
            break;
          }
      continue;
    }
    DeviceBuffers seq_mem;
    const void* sq = upload_to(seq_mem, unpack_bits(qb, p.H, p.D, seq.q0, seq.len_q));
    const void* sk = upload_to(seq_mem, unpack_bits(kb, p.Hkv, p.D, seq.k0, seq.len_k));
    const void* sv = upload_to(seq_mem, unpack_bits(vb, p.Hkv, p.Dv, seq.k0, seq.len_k));
    const void* sd = upload_to(seq_mem, unpack_bits(db, p.H, p.Dv, seq.q0, seq.len_q));
    const size_t sizes[3] = {ours[0].size(), ours[1].size(), ours[2].size()};
    std::vector<float> ref[3], low[3];
    for (bool low_precision : {false, true}) {
      float* out[3];
      for (int i = 0; i < 3; ++i) out[i] = seq_mem.alloc<float>(sizes[i] * 4);
      if (reference_attention_backward_fp32(ps, sq, sk, sv, sd, out[0], out[1], out[2], low_precision, nullptr, 0,
                                            nullptr) != cudaSuccess ||
          cudaDeviceSynchronize() != cudaSuccess) {
        worst = "the reference backward failed";
        break;
      }
      for (int i = 0; i < 3; ++i) {
        std::vector<float>& into = low_precision ? low[i] : ref[i];
        into.resize(sizes[i]);
        cudaMemcpy(into.data(), out[i], sizes[i] * 4, cudaMemcpyDeviceToHost);
      }
    }
    for (int i = 0; i < 3 && worst.empty(); ++i) {
      const std::vector<double> r(ref[i].begin(), ref[i].end()), l(low[i].begin(), low[i].end());
      const OutputComparison oc = compare_output(ours[i], r, l, p.dtype);
      const CheckResult res = judge(oc.stats, ErrorStats{}, oc.baseline_err, oc.rounding_err);
      if (!res.pass)
        worst = "sequence " + std::to_string(s) + " (" + std::to_string(seq.len_q) + " x " +
                std::to_string(seq.len_k) + ") " + names[i] + ": " + res.summary();
    }
  }
  record(worst.empty(), c.name() + ": " + worst);
  if (args.verbose && worst.empty()) std::printf("ok   %s\n", c.name().c_str());
  return true;
}

std::vector<Case> cases() {
  std::vector<Case> list;
  struct Dims {
    int D, Dv;
  };
  const Dims dims[] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}, {128, 64}};
  const struct {
    int H, Hkv;
  } heads[] = {{2, 2}, {4, 2}, {3, 1}};
  auto add = [&](std::vector<int> q, std::vector<int> k, int which, bool causal) {
    const Dims d = dims[which % 5];
    const auto h = heads[which % 3];
    const DType t = which % 2 ? DType::kBFloat16 : DType::kFloat16;
    list.push_back({q, k.empty() ? q : k, h.H, h.Hkv, d.D, d.Dv, t, causal});
  };
  int n = 0;
  for (bool causal : {false, true}) {
    for (int len : {1, 17, 129}) add({len}, {}, n++, causal);
    add({0, 5, 0, 300}, {}, n++, causal);
    add({127, 129, 1000}, {}, n++, causal);
    add({17, 300, 1, 64}, {40, 299, 0, 1}, n++, causal);   // keys and queries apart; a sequence without keys
    add({200, 33}, {50, 7}, n++, causal);                 // causal: rows that see no key
    add({1000, 1, 3, 130}, {}, n++, causal);              // one long sequence among short ones
  }
  // Every head-dim config in both dtypes, causal, on ragged lengths.
  for (int which = 0; which < 10; ++which) {
    const Dims d = dims[which / 2];
    list.push_back({{129, 1, 400}, {129, 1, 400}, 4, 2, d.D, d.Dv, which % 2 ? DType::kBFloat16 : DType::kFloat16, true});
  }
  // 37 random lengths (0 to 300), keys their own.
  std::mt19937 g(7);
  std::vector<int> q(37), k(37);
  for (int i = 0; i < 37; ++i) q[i] = int(g() % 301), k[i] = int(g() % 301);
  list.push_back({q, k, 4, 1, 128, 128, DType::kBFloat16, true});
  list.push_back({q, q, 2, 2, 64, 64, DType::kFloat16, false});
  // The backward: its three head-dim configs, both dtypes, causal and not, ragged; queries and keys apart.
  for (int which = 0; which < 6; ++which) {
    const Dims d = which < 2 ? dims[0] : which < 4 ? dims[1] : dims[3];
    Case bwd{{1, 17, 0, 300, 129}, {1, 17, 0, 300, 129}, 4, 2, d.D, d.Dv,
             which % 2 ? DType::kBFloat16 : DType::kFloat16, which % 3 != 0};
    bwd.bwd = true;
    list.push_back(bwd);
  }
  for (bool causal : {false, true}) {
    Case apart{{17, 200, 1, 64, 33, 0}, {40, 50, 0, 1, 7, 9}, 3, 1, 128, 128, DType::kBFloat16, causal};
    apart.bwd = true;
    list.push_back(apart);
  }
  Case control{{300, 100}, {300, 100}, 2, 2, 128, 128, DType::kFloat16, false};
  control.corrupt = true;
  list.push_back(control);
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  args = parse_case_args(argc, argv);
  if (!have_gpu()) return kSkipped;
  if (std::string why = hopper_tma_unsupported(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return kSkipped;
  }
  run_cases(args, cases(), 20261208, run_case);
  return finish();
}
