// Paged-KV decoding (kernels/varlen/paged_decode.h) against a CPU reference
// per sequence, on fresh normal inputs per case: each sequence's keys gathered
// from its pages through the block table into a dense K and V, the reference
// of that sequence alone (kernels/reference/mods_reference.h,
// mods_attention_cpu, with the bottom-right causal mask_mod or none), and O
// and LSE held to the project's rule (reference.h, judge): max|O − O_ref| <=
// 2·(the same-precision error) + 2·(rounding of O_ref to the dtype), |LSE −
// LSE_ref| <= kLseTolerance, nothing NaN or unwritten (O and LSE poisoned
// first). Pages are a random permutation of the cache's, the unused entries
// of the block table −1 (never read); rows that see no key (an empty cache,
// or causal tokens past it) hold O = 0, LSE = −inf.
// Cases: Nq = 1, 4, 16 (speculative decoding); page sizes 16, 64, 256 and
// odd ones (1, 7, 100); lengths 0, 1, page-ragged and long; GQA groups 1, 4,
// 8 and MQA; every head dim, both dtypes, causal and not; a negative control.
// Options: gpu_testing.h's CaseArgs (-v, --only TEXT).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "blocksparse/mods.h"
#include "gpu_testing.h"
#include "host/launch.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"
#include "varlen/paged_decode.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

CaseArgs args;

struct Case {
  std::vector<int> lengths;  // cache_seqlens, one per sequence
  int Nq, H, Hkv, D, page_size;
  DType dtype;
  bool causal;
  bool corrupt = false;  // negative control: one cached value changed after the run; must fail
  std::string name() const {
    std::string s = "lengths";
    for (size_t b = 0; b < lengths.size() && b < 6; ++b) s += (b ? "," : " ") + std::to_string(lengths[b]);
    if (lengths.size() > 6) s += ",... (" + std::to_string(lengths.size()) + ")";
    return s + " Nq=" + std::to_string(Nq) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) +
           " D=" + std::to_string(D) + " page=" + std::to_string(page_size) + " " + dtype_name(dtype) +
           (causal ? " causal" : "") + (corrupt ? " (negative control)" : "");
  }
};

template <typename T>
T* upload_to(DeviceBuffers& mem, const std::vector<T>& host) {
  T* dev = mem.alloc<T>(host.size() * sizeof(T));
  if (dev != nullptr && !host.empty()) cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return dev;
}

bool run_case(const Case& c, std::mt19937_64& rng) {
  const int B = int(c.lengths.size()), ps = c.page_size, D = c.D;
  PagedDecodeProblem dp;
  AttnProblem& p = dp.shape;
  p.B = B, p.H = c.H, p.Hkv = c.Hkv, p.Nq = c.Nq, p.Nk = 1, p.D = D, p.Dv = D, p.dtype = c.dtype, p.causal = c.causal;
  p.scale = default_scale(D);
  int used = 0, longest = 0;
  for (int n : c.lengths) used += (n + ps - 1) / ps, longest = std::max(longest, n);
  dp.page_size = ps;
  dp.max_pages = std::max(1, (longest + ps - 1) / ps + 1);  // a spare column, -1
  dp.num_pages = used + 3;                                  // pages no sequence reads
  // The used pages in a random order.
  std::vector<int> pages(size_t(dp.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int> table(size_t(B) * dp.max_pages, -1);
  int next = 0;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j * ps < c.lengths[size_t(b)]; ++j) table[size_t(b) * dp.max_pages + j] = pages[size_t(next++)];
  if (std::string why = paged_decode_tables_invalid(dp, table, c.lengths); !why.empty()) {
    record(false, c.name() + ": the case's tables: " + why);
    return true;
  }
  if (std::string why = paged_decode_unsupported(dp); !why.empty()) {
    record(false, c.name() + ": refused: " + why);
    return true;
  }
  std::vector<uint16_t> qb, kb, vb;
  std::vector<double> qv, kv, vv;
  random_tensor(rng, int64_t(B) * c.Nq * c.H * D, c.dtype, 1.0, qb, qv);
  random_tensor(rng, int64_t(dp.num_pages) * ps * c.Hkv * D, c.dtype, 1.0, kb, kv);
  random_tensor(rng, int64_t(dp.num_pages) * ps * c.Hkv * D, c.dtype, 1.0, vb, vv);
  const int64_t o_elems = int64_t(B) * c.Nq * c.H * D, lse_elems = int64_t(B) * c.H * c.Nq;
  DeviceBuffers mem;
  PagedDecodeBuffers buf;
  buf.q = upload_to(mem, qb), buf.k_cache = upload_to(mem, kb), buf.v_cache = upload_to(mem, vb);
  buf.block_table = upload_to(mem, table), buf.cache_seqlens = upload_to(mem, c.lengths);
  auto* o = mem.alloc<uint16_t>(size_t(o_elems) * 2);
  auto* lse = mem.alloc<float>(size_t(lse_elems) * 4);
  buf.workspace_bytes = paged_decode_workspace_bytes(dp);
  buf.workspace = mem.alloc<char>(buf.workspace_bytes);
  if (!buf.q || !buf.k_cache || !buf.v_cache || !buf.block_table || !buf.cache_seqlens || !o || !lse ||
      !buf.workspace) {
    record(false, c.name() + ": out of device memory");
    return true;
  }
  cudaMemset(o, 0xFF, size_t(o_elems) * 2);  // NaN: a row left unwritten fails
  cudaMemset(lse, 0xFF, size_t(lse_elems) * 4);
  buf.o = o, buf.lse = lse;
  cudaError_t err = paged_decode(dp, buf, nullptr);
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
  if (c.corrupt)  // sequence 0's first value row (KV head 0), as the reference sees it: +10 everywhere
    for (int d = 0; d < D; ++d) vv[size_t(table[0]) * ps * c.Hkv * D + d] += 10.0;

  std::string worst;
  for (int b = 0; b < B && worst.empty(); ++b) {
    const int L = c.lengths[size_t(b)];
    AttnProblem s = p;
    s.B = 1, s.Nk = L;
    // The sequence densely: Q [H, Nq, D], K, V [Hkv, L, D] gathered through the table.
    std::vector<double> q(size_t(c.H) * c.Nq * D), k(size_t(c.Hkv) * L * D), v(k.size());
    for (int h = 0; h < c.H; ++h)
      for (int t = 0; t < c.Nq; ++t)
        for (int d = 0; d < D; ++d)
          q[(size_t(h) * c.Nq + t) * D + d] = qv[((size_t(b) * c.Nq + t) * c.H + h) * D + d];
    for (int hk = 0; hk < c.Hkv; ++hk)
      for (int j = 0; j < L; ++j) {
        const size_t row = (size_t(table[size_t(b) * dp.max_pages + j / ps]) * ps + j % ps) * c.Hkv + hk;
        for (int d = 0; d < D; ++d) {
          k[(size_t(hk) * L + j) * D + d] = kv[row * D + d];
          v[(size_t(hk) * L + j) * D + d] = vv[row * D + d];
        }
      }
    std::vector<double> o_ref, lse_ref, o_low;
    if (L > 0) {
      std::string why;
      const MaskMod mask = c.causal ? parse_mask_mod("causal", c.Nq, L, why) : MaskMod{};
      mods_attention_cpu(s, mask, ScoreMod{}, q, k, v, o_ref, lse_ref, o_low);
    } else {
      o_ref.assign(size_t(c.H) * c.Nq * D, 0.0);
      o_low = o_ref;
      lse_ref.assign(size_t(c.H) * c.Nq, -std::numeric_limits<double>::infinity());
    }
    std::vector<uint16_t> ours(o_ref.size());
    ErrorStats ls;
    for (int h = 0; h < c.H; ++h)
      for (int t = 0; t < c.Nq; ++t) {
        for (int d = 0; d < D; ++d)
          ours[(size_t(h) * c.Nq + t) * D + d] = ob[((size_t(b) * c.Nq + t) * c.H + h) * D + d];
        const double got = lse_h[(size_t(b) * c.H + h) * c.Nq + t], want = lse_ref[size_t(h) * c.Nq + t];
        if (std::isinf(want)) {
          if (!(std::isinf(got) && got < 0)) ++ls.nonfinite;
        } else if (!std::isfinite(got)) {
          ++ls.nonfinite;
        } else {
          ls.max_abs_err = std::max(ls.max_abs_err, std::fabs(got - want));
        }
      }
    const OutputComparison oc = compare_output(ours, o_ref, o_low, c.dtype);
    const CheckResult r = judge(oc.stats, ls, oc.baseline_err, oc.rounding_err);
    if (!r.pass) worst = "sequence " + std::to_string(b) + " (" + std::to_string(L) + " keys): " + r.summary();
  }
  if (c.corrupt) record(!worst.empty(), c.name() + ": the changed key went unnoticed");
  else record(worst.empty(), c.name() + ": " + worst);
  if (args.verbose && worst.empty() != c.corrupt) std::printf("ok   %s\n", c.name().c_str());
  return true;
}

std::vector<Case> cases() {
  std::vector<Case> list;
  const int dims[] = {64, 128, 256};
  const struct {
    int H, Hkv;
  } heads[] = {{8, 8}, {8, 2}, {32, 4}, {6, 1}};
  int n = 0;
  for (bool causal : {true, false})
    for (int Nq : {1, 4, 16})
      for (int page : {16, 64, 256, 7}) {
        const auto h = heads[n % 4];
        list.push_back({{1000, 0, 1, 17, 300}, Nq, h.H, h.Hkv, dims[n % 3], page,
                        n % 2 ? DType::kBFloat16 : DType::kFloat16, causal});
        ++n;
      }
  // Odd pages, a long cache, tokens past a short one (causal rows that see no key).
  list.push_back({{3000, 64}, 1, 16, 2, 128, 1, DType::kBFloat16, true});
  list.push_back({{5000}, 2, 8, 1, 128, 100, DType::kFloat16, true});
  list.push_back({{3, 2, 0}, 8, 4, 4, 64, 16, DType::kFloat16, true});
  Case control{{400, 300}, 1, 8, 2, 128, 64, DType::kFloat16, false};
  control.corrupt = true;
  list.push_back(control);
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  args = parse_case_args(argc, argv);
  if (!have_gpu()) return kSkipped;
  run_cases(args, cases(), 20261209, run_case);
  return finish();
}
