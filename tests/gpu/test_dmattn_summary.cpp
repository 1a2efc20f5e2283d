// GPU test of the dynamic-mask pre-pass (dma_summarize_mask,
// kernels/dmattn/dmattn_mask_summary.cu), ctest -L gpu: its `any` / `all`
// bits, one per 64x64 tile, against the same bits computed on the CPU.
//   - ragged sizes: Nq, Nk in {1, 63, 64, 65, 130, 1000, 2049} and a few
//     larger ones (several 32-tile words, more than one query tile per word);
//   - causal (bottom-right aligned) and not; query-broadcast masks (q == 1);
//     several mask batches and heads;
//   - layouts: dense strides, padded 16-byte aligned strides (the vector path
//     with a ragged last tile and a 16-byte piece straddling Nk), and a base
//     one byte off 16 (the scalar path);
//   - tiles all zero, all one, all one but one zero byte, all zero but one
//     nonzero byte, random at a low or high density; nonzero bytes are any of
//     1..255; the padding around the mask is random (half zeros), so a kernel
//     that reads past Nk or Nq would change some answer.
// Compared: every tile the causal rule says is read (key tile start <= the
// last key any row of the query tile sees); tiles past it must be 0 (the
// kernel writes 0 there; no attention kernel asks). Output words are poisoned
// first, so a word never written fails.
// Then the forward's in-kernel scan (one split), which stores the same
// summary for the backward: its words against the pre-pass's, bitwise.
// Compiled as CUDA (CMakeLists.txt): dmattn_tiles.cuh has device code.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"
#include "gpu_testing.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

enum class Layout { kDense, kPadded, kMisaligned };

struct SummaryCase {
  int mb, mh, Nq, Nk;
  bool causal, q_broadcast;
  Layout layout;
  double density;  // of the random tiles
  std::string name() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "mask (%d, %d, %d, %d) Nq=%d%s %s density=%g", mb, mh, q_broadcast ? 1 : Nq, Nk,
                  Nq, causal ? " causal" : "",
                  layout == Layout::kDense ? "dense" : layout == Layout::kPadded ? "padded" : "misaligned", density);
    return buf;
  }
};

void run_case(const SummaryCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int mq = c.q_broadcast ? 1 : c.Nq;
  // Strides in bytes: padded rows are 16-byte multiples with room to spare;
  // heads and batches get a gap of their own.
  const int64_t pitch = c.layout == Layout::kPadded ? (int64_t(c.Nk) + 15) / 16 * 16 + 16 * int64_t(rng() % 3) : c.Nk;
  const int64_t head_gap = c.layout == Layout::kPadded ? 32 : 0;
  const int64_t stride_q = mq > 1 ? pitch : 0;
  const int64_t stride_h = c.mh > 1 ? int64_t(mq) * pitch + head_gap : 0;
  const int64_t stride_b = c.mb > 1 ? int64_t(c.mh) * (int64_t(mq) * pitch + head_gap) : 0;
  const int64_t offset = c.layout == Layout::kMisaligned ? 1 : c.layout == Layout::kPadded ? 32 : 0;
  const int64_t span = int64_t(c.mb) * c.mh * (int64_t(mq) * pitch + head_gap);
  const int64_t bytes = offset + span + 4096;  // guard after the end

  // Everything random first (padding: half zeros), then the mask proper, tile by tile.
  std::vector<uint8_t> buf(static_cast<size_t>(bytes));
  std::uniform_int_distribution<int> byte(1, 255);
  for (auto& x : buf) x = (rng() & 1) ? uint8_t(byte(rng)) : 0;
  auto at = [&](int b, int h, int i, int j) -> uint8_t& {
    return buf[size_t(offset + b * stride_b + h * stride_h + int64_t(i) * stride_q + j)];
  };
  std::bernoulli_distribution on(c.density);
  const int q_tiles = (mq + kDmaBr - 1) / kDmaBr, k_tiles = (c.Nk + kDmaBc - 1) / kDmaBc;
  for (int b = 0; b < c.mb; ++b)
    for (int h = 0; h < c.mh; ++h)
      for (int m = 0; m < q_tiles; ++m)
        for (int n = 0; n < k_tiles; ++n) {
          const int i0 = m * kDmaBr, i1 = std::min(mq, i0 + kDmaBr);
          const int j0 = n * kDmaBc, j1 = std::min(c.Nk, j0 + kDmaBc);
          const int kind = int(rng() % 5);
          for (int i = i0; i < i1; ++i)
            for (int j = j0; j < j1; ++j)
              at(b, h, i, j) = kind == 0 ? 0 : kind == 1 || kind == 2 ? uint8_t(byte(rng)) : kind == 3 ? 0
                                                                       : on(rng) ? uint8_t(byte(rng)) : 0;
          // One odd byte out: a zero in an all-ones tile, a one in an all-zero tile.
          const int i = i0 + int(rng() % uint64_t(i1 - i0)), j = j0 + int(rng() % uint64_t(j1 - j0));
          if (kind == 2) at(b, h, i, j) = 0;
          if (kind == 3) at(b, h, i, j) = uint8_t(byte(rng));
        }

  DynamicMaskProblem p;
  p.B = c.mb;
  p.H = p.Hkv = c.mh;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.causal = c.causal;
  uint8_t* d_buf = upload(buf);
  if (d_buf == nullptr) {
    record(false, "out of memory: " + c.name());
    return;
  }
  p.mask.data = d_buf + offset;
  p.mask.b = c.mb;
  p.mask.h = c.mh;
  p.mask.q = mq;
  p.mask.stride_b = stride_b;
  p.mask.stride_h = stride_h;
  p.mask.stride_q = stride_q;

  const size_t summary_bytes = dma_mask_summary_bytes(p);
  uint32_t* d_storage = nullptr;
  cudaMalloc(&d_storage, summary_bytes);
  cudaMemset(d_storage, 0xab, summary_bytes);  // poison: a word never written fails
  MaskSummary s;
  cudaError_t e = dma_summarize_mask(p, d_storage, &s, 0);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  const int words = (k_tiles + 31) / 32;
  const size_t n_words = size_t(c.mb) * c.mh * q_tiles * words;
  std::vector<uint32_t> any(n_words), all(n_words);
  bool ok = e == cudaSuccess && s.any != nullptr && s.all != nullptr && s.q_tiles == q_tiles && s.words == words &&
            2 * n_words * sizeof(uint32_t) == summary_bytes;
  if (ok) {
    cudaMemcpy(any.data(), s.any, n_words * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    cudaMemcpy(all.data(), s.all, n_words * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  }

  // The same mask bit-packed (DmaMaskFormat::kBits) must give the same words.
  // Dense and misaligned layouts: packed on the GPU from this byte layout
  // (dma_pack_mask_bits, checked against a CPU packing); padded: rows of
  // extra words, with random bits in the gaps and in the padding bits past
  // Nk, which the scan must not read as keys.
  if (ok) {
    const int64_t row_words = dma_mask_bit_row_words(c.Nk);
    const bool padded = c.layout == Layout::kPadded;
    const int64_t pitch_w = padded ? row_words + 2 * int64_t(1 + rng() % 2) : row_words;
    const int64_t n_rows = int64_t(c.mb) * c.mh * mq;
    std::vector<uint32_t> bits(size_t(n_rows * pitch_w), 0u);
    for (int b = 0; b < c.mb; ++b)
      for (int h = 0; h < c.mh; ++h)
        for (int i = 0; i < mq; ++i) {
          uint32_t* row = bits.data() + ((int64_t(b) * c.mh + h) * mq + i) * pitch_w;
          if (padded)
            for (int64_t w = 0; w < pitch_w; ++w) row[w] = uint32_t(rng());
          for (int64_t w = 0; w < row_words; ++w)
            for (int k = 0; k < 32 && 32 * w + k < c.Nk; ++k) {
              const uint32_t bit = 1u << k;
              row[w] = at(b, h, i, int(32 * w + k)) != 0 ? row[w] | bit : row[w] & ~bit;
            }
        }
    DynamicMaskProblem pb = p;
    pb.mask_format = DmaMaskFormat::kBits;
    pb.mask.stride_q = mq > 1 ? pitch_w : 0;
    pb.mask.stride_h = c.mh > 1 ? int64_t(mq) * pitch_w : 0;
    pb.mask.stride_b = c.mb > 1 ? int64_t(c.mh) * mq * pitch_w : 0;
    uint32_t* d_bits = upload(bits);
    cudaError_t eb = d_bits ? cudaSuccess : cudaErrorMemoryAllocation;
    std::vector<uint32_t> packed(bits.size());
    if (!padded && eb == cudaSuccess) {
      cudaMemset(d_bits, 0xFF, bits.size() * 4);
      eb = dma_pack_mask_bits(p, d_bits, 0);
      if (eb == cudaSuccess) eb = cudaMemcpy(packed.data(), d_bits, bits.size() * 4, cudaMemcpyDeviceToHost);
      record(eb == cudaSuccess && packed == bits, "dma_pack_mask_bits == CPU packing: " + c.name());
    }
    pb.mask.data = d_bits;
    cudaMemset(d_storage, 0xab, summary_bytes);
    MaskSummary sb;
    if (eb == cudaSuccess) eb = dma_summarize_mask(pb, d_storage, &sb, 0);
    if (eb == cudaSuccess) eb = cudaDeviceSynchronize();
    std::vector<uint32_t> got(2 * n_words);
    if (eb == cudaSuccess) cudaMemcpy(got.data(), d_storage, summary_bytes, cudaMemcpyDeviceToHost);
    std::vector<uint32_t> want(any);
    want.insert(want.end(), all.begin(), all.end());
    record(eb == cudaSuccess && got == want,
           std::string("bit-packed mask's summary == the byte mask's") + (padded ? " (padded rows, random padding)" : "") +
               ": " + c.name());
    if (d_bits) cudaFree(d_bits);
  }
  cudaFree(d_storage);
  cudaFree(d_buf);
  if (!ok) {
    record(false, "dma_summarize_mask (" + std::string(cudaGetErrorString(e)) + "): " + c.name());
    return;
  }

  int wrong_read = 0, wrong_unread = 0;
  std::string first;
  for (int b = 0; b < c.mb; ++b)
    for (int h = 0; h < c.mh; ++h)
      for (int m = 0; m < q_tiles; ++m) {
        const int i0 = m * kDmaBr, i1 = c.q_broadcast ? 1 : std::min(c.Nq, i0 + kDmaBr);
        // The last key any row of the tile sees, plus one (bottom-right aligned causal).
        int64_t key_end = c.Nk;
        if (c.causal && !c.q_broadcast) key_end = std::max<int64_t>(0, std::min<int64_t>(c.Nk, int64_t(i1 - 1) + c.Nk - c.Nq + 1));
        for (int n = 0; n < words * 32; ++n) {
          const size_t w = ((size_t(b) * c.mh + h) * q_tiles + m) * words + n / 32;
          const bool got_any = any[w] >> (n % 32) & 1u, got_all = all[w] >> (n % 32) & 1u;
          const int j0 = n * kDmaBc, j1 = std::min(c.Nk, j0 + kDmaBc);
          if (j0 >= key_end) {  // never read: 0 (including tiles past Nk)
            if (got_any || got_all) ++wrong_unread;
            continue;
          }
          bool want_any = false, want_all = true;
          for (int i = i0; i < i1; ++i)
            for (int j = j0; j < j1; ++j) {
              const bool x = at(b, h, i, j) != 0;
              want_any = want_any || x;
              want_all = want_all && x;
            }
          if (got_any != want_any || got_all != want_all) {
            if (wrong_read++ == 0) {
              char msg[160];
              std::snprintf(msg, sizeof msg, " (first: b=%d h=%d m=%d n=%d any %d/%d all %d/%d)", b, h, m, n, got_any,
                            want_any, got_all, want_all);
              first = msg;
            }
          }
        }
      }
  record(wrong_read == 0, "summary bits of read tiles: " + std::to_string(wrong_read) + " wrong" + first + ": " +
                              c.name());
  record(wrong_unread == 0,
         "summary bits past the causal reach are 0: " + std::to_string(wrong_unread) + " wrong: " + c.name());
}

// The forward's in-kernel scan with one split stores the summary as a
// by-product (dma_forward_mask_summary, for the backward): every word of it
// must equal the pre-pass's (checked above against the CPU), with the
// workspace poisoned first, across broadcasts over batch, heads (GQA groups)
// and queries — where only one of the blocks sharing a summary row stores it.
struct ForwardCase {
  int B, H, Hkv, Nq, Nk, D;
  bool causal;
  int mb, mh, mq;  // mask sizes: mb in {1, B}, mh in {1, Hkv, H}, mq in {1, Nq}
  int splits;      // > 1: no summary (each block scans part of a row)
  std::string name() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "forward B=%d H=%d Hkv=%d Nq=%d Nk=%d D=%d%s mask (%d, %d, %d, %d) splits %d", B, H,
                  Hkv, Nq, Nk, D, causal ? " causal" : "", mb, mh, mq, Nk, splits);
    return buf;
  }
};

void run_forward_case(const ForwardCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  DynamicMaskProblem p;
  p.B = c.B;
  p.H = c.H;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.D = c.D;
  p.causal = c.causal;
  p.scale = 1.0f / std::sqrt(float(c.D));
  // Tiles of five kinds (all zero, all one, random dense / sparse, one odd byte).
  std::vector<uint8_t> mask(size_t(c.mb) * c.mh * c.mq * c.Nk);
  std::uniform_int_distribution<int> byte(1, 255);
  const int q_tiles = (c.mq + kDmaBr - 1) / kDmaBr, k_tiles = (c.Nk + kDmaBc - 1) / kDmaBc;
  for (int bh = 0; bh < c.mb * c.mh; ++bh)
    for (int m = 0; m < q_tiles; ++m)
      for (int n = 0; n < k_tiles; ++n) {
        const int kind = int(rng() % 5);
        for (int i = m * kDmaBr; i < std::min(c.mq, (m + 1) * kDmaBr); ++i)
          for (int j = n * kDmaBc; j < std::min(c.Nk, (n + 1) * kDmaBc); ++j)
            mask[(size_t(bh) * c.mq + i) * c.Nk + j] =
                kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? uint8_t(rng() % 8 != 0) : uint8_t(rng() % 50 == 0) * 7;
      }
  std::vector<uint16_t> qb, kb, vb;
  std::vector<double> vals;
  random_tensor(rng, int64_t(c.B) * c.H * c.Nq * c.D, p.dtype, 1.0, qb, vals);
  random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, p.dtype, 1.0, kb, vals);
  random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, p.dtype, 1.0, vb, vals);
  uint8_t* d_mask = upload(mask);
  uint16_t *d_q = upload(qb), *d_k = upload(kb), *d_v = upload(vb), *d_o = upload(qb);
  float* d_lse = nullptr;
  cudaMalloc(&d_lse, size_t(c.B) * c.H * c.Nq * sizeof(float));
  p.mask.data = d_mask;
  p.mask.set_shape(c.mb, c.mh, c.mq, c.Nk, c.H);
  const size_t ws_bytes = dma_forward_workspace_bytes(p, c.splits), summary_bytes = dma_mask_summary_bytes(p);
  float* d_ws = nullptr;
  uint32_t* d_ref = nullptr;
  cudaMalloc(&d_ws, ws_bytes);
  cudaMalloc(&d_ref, summary_bytes);
  cudaMemset(d_ws, 0xab, ws_bytes);  // poison: a word never written fails
  DmaForwardArgs a;
  a.q = d_q;
  a.k = d_k;
  a.v = d_v;
  a.o = d_o;
  a.lse = d_lse;
  a.splits = c.splits;
  a.workspace = d_ws;
  a.workspace_bytes = ws_bytes;
  a.mask_scan = DmaMaskScan::kInKernel;
  const bool expect = c.splits == 1 && dma_forward_core_name(p, DmaCore::kAuto) != "gather";
  const uint32_t* reported = dma_forward_mask_summary(p, a);
  record(reported == (expect ? reinterpret_cast<const uint32_t*>(d_ws) : nullptr),
         std::string("dma_forward_mask_summary ") + (expect ? "is the workspace" : "is null") + ": " + c.name());
  cudaError_t e = d_mask && d_q && d_k && d_v && d_o && d_lse && d_ws && d_ref ? cudaSuccess : cudaErrorMemoryAllocation;
  if (e == cudaSuccess) e = dma_forward(p, a, 0);
  if (e == cudaSuccess) e = dma_build_mask_summary(p, d_ref, 0);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  std::vector<uint32_t> got(summary_bytes / 4), want(summary_bytes / 4), got_bits(summary_bytes / 4);
  if (e == cudaSuccess) {
    cudaMemcpy(got.data(), d_ws, summary_bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(want.data(), d_ref, summary_bytes, cudaMemcpyDeviceToHost);
  }
  // The in-kernel scan of the same mask bit-packed, on the same buffers (the
  // workspace poisoned again): it must store the same words.
  uint32_t* d_bits = nullptr;
  cudaError_t e_bits = cudaErrorMemoryAllocation;
  bool bits_reported = false;
  if (expect && e == cudaSuccess && cudaMalloc(&d_bits, dma_mask_bits_bytes(p)) == cudaSuccess) {
    const DynamicMaskProblem pb = dma_with_bit_mask(p, d_bits);
    bits_reported = dma_forward_mask_summary(pb, a) == reinterpret_cast<const uint32_t*>(d_ws);
    cudaMemset(d_ws, 0xab, ws_bytes);
    e_bits = dma_pack_mask_bits(p, d_bits, 0);
    if (e_bits == cudaSuccess) e_bits = dma_forward(pb, a, 0);
    if (e_bits == cudaSuccess) e_bits = cudaMemcpy(got_bits.data(), d_ws, summary_bytes, cudaMemcpyDeviceToHost);
  }
  for (void* ptr : {(void*)d_mask, (void*)d_q, (void*)d_k, (void*)d_v, (void*)d_o, (void*)d_lse, (void*)d_ws,
                    (void*)d_ref, (void*)d_bits})
    cudaFree(ptr);
  if (e != cudaSuccess) {
    record(false, "dma_forward (" + std::string(cudaGetErrorString(e)) + "): " + c.name());
    return;
  }
  if (!expect) return;
  record(e_bits == cudaSuccess && bits_reported && got_bits == want,
         "in-kernel scan of the bit-packed mask: summary words equal the pre-pass's: " + c.name());
  size_t wrong = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && wrong++ == 0) first = i;
  record(wrong == 0, "in-kernel scan's summary words equal the pre-pass's: " + std::to_string(wrong) + " of " +
                         std::to_string(got.size()) + " wrong" +
                         (wrong ? " (first: word " + std::to_string(first) + ")" : std::string()) + ": " + c.name());
}

}  // namespace

int main() {
  if (!have_gpu()) return kSkipped;
  uint64_t seed = 9100;
  std::vector<SummaryCase> cases;
  const int sizes[] = {1, 63, 64, 65, 130, 1000, 2049};
  for (int nq : sizes)
    for (int nk : sizes)
      for (bool causal : {false, true})
        for (bool qb : {false, true})
          for (Layout l : {Layout::kDense, Layout::kPadded, Layout::kMisaligned}) {
            if (qb && causal && nq != nk) continue;  // a broadcast mask's summary ignores causal: a few suffice
            cases.push_back(SummaryCase{1, 1, nq, nk, causal, qb, l, (nq + nk) % 2 ? 0.02 : 0.98});
          }
  // Several batches and heads; several words of 32 key tiles; a long row.
  for (bool causal : {false, true})
    for (Layout l : {Layout::kDense, Layout::kPadded, Layout::kMisaligned})
      for (auto [nq, nk] : {std::pair{200, 4111}, std::pair{2100, 2100}, std::pair{64, 8192}, std::pair{3000, 2100}}) {
        cases.push_back(SummaryCase{2, 3, nq, nk, causal, false, l, 0.5});
        cases.push_back(SummaryCase{2, 3, nq, nk, causal, true, l, 0.98});
      }
  cases.push_back(SummaryCase{1, 1, 128, 32768, true, false, Layout::kDense, 0.98});
  cases.push_back(SummaryCase{1, 2, 1100, 16384 + 64 + 17, true, false, Layout::kPadded, 0.02});
  std::printf("%zu cases\n", cases.size());
  for (const SummaryCase& c : cases) run_case(c, ++seed);

  // The forward's in-kernel scan writing the same summary.
  std::vector<ForwardCase> fwd;
  const std::pair<int, int> shapes[] = {{1, 1}, {17, 17}, {127, 129}, {1000, 1000}, {70, 4111}, {3000, 2100},
                                        {64, 8192}, {200, 130}};
  for (auto [nq, nk] : shapes)
    for (bool causal : {false, true})
      for (int d : {32, 64, 128}) fwd.push_back(ForwardCase{1, 1, 1, nq, nk, d, causal, 1, 1, nq, 1});
  // Broadcasts: B = 2, H = 4, Hkv = 2; the mask over batch, heads, GQA groups, queries.
  for (auto [nq, nk] : {std::pair{130, 300}, std::pair{200, 2100}})
    for (bool causal : {false, true})
      for (auto [mb, mh, qb] : {std::tuple{1, 1, false}, std::tuple{2, 2, false}, std::tuple{1, 4, false},
                                std::tuple{2, 4, false}, std::tuple{2, 1, true}, std::tuple{1, 2, true}})
        fwd.push_back(ForwardCase{2, 4, 2, nq, nk, 64, causal, mb, mh, qb ? 1 : nq, 1});
  fwd.push_back(ForwardCase{1, 2, 1, 1, 4111, 64, false, 1, 1, 1, 1});   // one query row: the gather core, no summary
  fwd.push_back(ForwardCase{1, 2, 1, 70, 4111, 64, true, 1, 1, 70, 3});  // split: no summary
  std::printf("%zu forward cases\n", fwd.size());
  for (const ForwardCase& c : fwd) run_forward_case(c, ++seed);
  return finish();
}
