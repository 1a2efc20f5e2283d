// The GPU block-mask builder (kernels/blocksparse/block_mask_gpu.h) against
// the CPU reference builders, array for array: every mask_mod (document ids
// random per batch), ragged lengths (1, 17, 113 x 203, 239 x 1, 799 x 3,
// 300 x 1000, 128 x 8192), block sizes 64 x 64, 128 x 128, 256 x 256 and
// 128 x 64, B = 2 H = 3; then dense keep masks (random and causal, each in
// the four broadcast forms) and tensor mask_mods (bit-packed words with empty,
// full and partial tiles and the padding bits set, in three broadcast forms:
// the builder reads them a word at a time); every result also passes
// block_mask_invalid.
// Arrays are poisoned before each build, so a list left unwritten fails.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../block_mask_cases.h"
#include "../tensor_mods_cases.h"
#include "blocksparse/block_mask.h"
#include "blocksparse/block_mask_gpu.h"
#include "gpu_testing.h"

using namespace attnlab;
using namespace attnlab::testing;
using block_mask_cases::random_docs;

namespace {

struct Shape {
  int Nq, Nk;
};
const Shape kShapes[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {300, 1000}, {128, 8192}};
const int kBlocks[][2] = {{64, 64}, {128, 128}, {256, 256}, {128, 64}};
constexpr int kB = 2, kH = 3;

// "" when the two block masks hold the same lists, else the first difference.
std::string difference(const BlockMask& got, const BlockMask& want) {
  if (got.m_blocks != want.m_blocks || got.n_blocks != want.n_blocks) return "block counts";
  const struct {
    const char* name;
    const std::vector<int32_t>& g;
    const std::vector<int32_t>& w;
  } arrays[] = {{"kv_count", got.kv_count, want.kv_count},       {"kv_index", got.kv_index, want.kv_index},
                {"full_count", got.full_count, want.full_count}, {"full_index", got.full_index, want.full_index},
                {"q_count", got.q_count, want.q_count},          {"q_index", got.q_index, want.q_index},
                {"full_q_count", got.full_q_count, want.full_q_count},
                {"full_q_index", got.full_q_index, want.full_q_index}};
  for (const auto& a : arrays) {
    if (a.g.size() != a.w.size()) return std::string(a.name) + ": size";
    for (size_t i = 0; i < a.g.size(); ++i)
      if (a.g[i] != a.w[i])
        return std::string(a.name) + "[" + std::to_string(i) + "] = " + std::to_string(a.g[i]) + ", want " +
               std::to_string(a.w[i]);
  }
  return "";
}

// Device memory for one block mask of this shape, poisoned (0xff bytes).
struct DeviceMask {
  void* base = nullptr;
  BlockMaskView view;
  DeviceMask(int Nq, int Nk, int bq, int bkv) {
    const size_t bytes = block_mask_device_bytes(kB, kH, Nq, Nk, bq, bkv);
    cudaMalloc(&base, bytes);
    cudaMemset(base, 0xff, bytes);
    view = block_mask_view(base, kB, kH, Nq, Nk, bq, bkv);
  }
  ~DeviceMask() { cudaFree(base); }
};

void check(const BlockMaskView& view, cudaError_t err, const BlockMask& want, const std::string& what) {
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    record(false, what + ": " + cudaGetErrorString(err));
    return;
  }
  const BlockMask got = download_block_mask(view);
  const std::string diff = difference(got, want);
  record(diff.empty(), what + ": " + diff);
  const std::string invalid = block_mask_invalid(got, kB, kH, want.Nq, want.Nk);
  record(invalid.empty(), what + ": " + invalid);
}

}  // namespace

int main() {
  if (!have_gpu()) return kSkipped;
  std::mt19937 rng(11);
  for (const Shape& s : kShapes) {
    const int L = std::max(s.Nq, s.Nk);
    const std::vector<int32_t> doc = random_docs(kB, L, rng);
    int32_t* d_doc = nullptr;
    cudaMalloc(&d_doc, doc.size() * 4);
    cudaMemcpy(d_doc, doc.data(), doc.size() * 4, cudaMemcpyHostToDevice);
    for (const char* spec : block_mask_cases::kMaskModSpecs) {
      std::string why;
      MaskMod mod = parse_mask_mod(spec, s.Nq, s.Nk, why);
      record(why.empty(), std::string(spec) + ": " + why);
      for (const auto& blk : kBlocks) {
        const std::string what = std::string(spec) + " " + std::to_string(s.Nq) + "x" + std::to_string(s.Nk) +
                                 " blocks " + std::to_string(blk[0]) + "x" + std::to_string(blk[1]);
        MaskMod host_mod = mod, dev_mod = mod;
        if (mod.kind == MaskModKind::kDocument) {
          host_mod.doc = doc.data(), host_mod.doc_len = L;
          dev_mod.doc = d_doc, dev_mod.doc_len = L;
        }
        const BlockMask want = block_mask_from_mod(host_mod, kB, kH, s.Nq, s.Nk, blk[0], blk[1]);
        DeviceMask dm(s.Nq, s.Nk, blk[0], blk[1]);
        check(dm.view, build_block_mask_from_mod(dev_mod, dm.view, nullptr), want, what);
      }
    }
    cudaFree(d_doc);

    // Dense keep masks: random (about half kept) and causal, [mask_B][mask_H][Nq][Nk].
    for (const bool causal : {false, true})
      for (const int mask_B : {1, kB})
        for (const int mask_H : {1, kH}) {
          if (int64_t(s.Nq) * s.Nk > (1 << 20)) continue;  // the CPU reference's time
          std::vector<uint8_t> keep(size_t(mask_B) * mask_H * s.Nq * s.Nk);
          for (size_t i = 0; i < keep.size(); ++i) {
            const int q = int(i / s.Nk % s.Nq), k = int(i % s.Nk);
            keep[i] = causal ? uint8_t(k <= q + s.Nk - s.Nq) : uint8_t(rng() % 2);
          }
          uint8_t* d_keep = nullptr;
          cudaMalloc(&d_keep, keep.size());
          cudaMemcpy(d_keep, keep.data(), keep.size(), cudaMemcpyHostToDevice);
          for (const auto& blk : kBlocks) {
            const std::string what = std::string(causal ? "dense causal " : "dense random ") +
                                     std::to_string(s.Nq) + "x" + std::to_string(s.Nk) + " mask " +
                                     std::to_string(mask_B) + "x" + std::to_string(mask_H) + " blocks " +
                                     std::to_string(blk[0]) + "x" + std::to_string(blk[1]);
            const BlockMask want =
                block_mask_from_dense(keep, mask_B, mask_H, kB, kH, s.Nq, s.Nk, blk[0], blk[1]);
            DeviceMask dm(s.Nq, s.Nk, blk[0], blk[1]);
            check(dm.view, build_block_mask_from_dense(d_keep, mask_B, mask_H, dm.view, nullptr), want, what);
          }
          cudaFree(d_keep);
        }
  }
  // Tensor mask_mods: the words against the CPU builder evaluating them pair by pair.
  std::mt19937_64 rng64(12);
  for (const Shape& s : kShapes)
    for (const auto form : {tensor_mods_cases::Form::kFull, tensor_mods_cases::Form::kHeadsKeys,
                            tensor_mods_cases::Form::kBatchQueries}) {
      const tensor_mods_cases::PairShape shape = tensor_mods_cases::pair_shape(form, kB, kH, s.Nq);
      const std::vector<uint32_t> bits = tensor_mods_cases::random_mask_bits(rng64, shape, s.Nq, s.Nk);
      uint32_t* d_bits = nullptr;
      cudaMalloc(&d_bits, bits.size() * 4);
      cudaMemcpy(d_bits, bits.data(), bits.size() * 4, cudaMemcpyHostToDevice);
      MaskMod host_mod;
      host_mod.kind = MaskModKind::kTensor;
      host_mod.bits = shape.strides(dma_mask_bit_row_words(s.Nk));
      MaskMod dev_mod = host_mod;
      host_mod.bits.data = bits.data();
      dev_mod.bits.data = d_bits;
      for (const auto& blk : kBlocks) {
        const std::string what = std::string("tensor ") + tensor_mods_cases::form_name(form) + " " +
                                 std::to_string(s.Nq) + "x" + std::to_string(s.Nk) + " blocks " +
                                 std::to_string(blk[0]) + "x" + std::to_string(blk[1]);
        const BlockMask want = block_mask_from_mod(host_mod, kB, kH, s.Nq, s.Nk, blk[0], blk[1]);
        DeviceMask dm(s.Nq, s.Nk, blk[0], blk[1]);
        check(dm.view, build_block_mask_from_mod(dev_mod, dm.view, nullptr), want, what);
      }
      cudaFree(d_bits);
    }
  // A broadcast form that is neither 1 nor the problem's is refused.
  {
    DeviceMask dm(17, 17, 64, 64);
    record(build_block_mask_from_dense(nullptr, 3, 1, dm.view, nullptr) == cudaErrorInvalidValue,
           "mask_B = 3 with B = 2 refused");
  }
  return finish();
}
