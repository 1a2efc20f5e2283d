// attnlab: the block mask's reference builders, its transpose and its checks
// (block_mask.h); the mask_mod / score_mod spec parser (mods.h).
#include "blocksparse/block_mask.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <string>

namespace attnlab {
namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }

BlockMask empty_mask(int B, int H, int Nq, int Nk, int block_q, int block_kv) {
  BlockMask bm;
  bm.B = B;
  bm.H = H;
  bm.Nq = Nq;
  bm.Nk = Nk;
  bm.block_q = block_q;
  bm.block_kv = block_kv;
  bm.m_blocks = ceil_div(Nq, block_q);
  bm.n_blocks = ceil_div(Nk, block_kv);
  return bm;
}

// kinds[b][h][m][n] from keep(b, h, q, k) over each block's in-bounds pairs.
template <typename Keep>
std::vector<BlockKind> classify(const BlockMask& shape, Keep&& keep) {
  std::vector<BlockKind> kinds(size_t(shape.B) * shape.H * shape.m_blocks * shape.n_blocks, BlockKind::kEmpty);
  size_t at = 0;
  for (int b = 0; b < shape.B; ++b)
    for (int h = 0; h < shape.H; ++h)
      for (int m = 0; m < shape.m_blocks; ++m)
        for (int n = 0; n < shape.n_blocks; ++n, ++at) {
          const int q_end = std::min(shape.Nq, (m + 1) * shape.block_q);
          const int k_end = std::min(shape.Nk, (n + 1) * shape.block_kv);
          int64_t kept = 0;
          for (int q = m * shape.block_q; q < q_end; ++q)
            for (int k = n * shape.block_kv; k < k_end; ++k) kept += keep(b, h, q, k) ? 1 : 0;
          const int64_t pairs = int64_t(q_end - m * shape.block_q) * (k_end - n * shape.block_kv);
          kinds[at] = kept == 0 ? BlockKind::kEmpty : kept == pairs ? BlockKind::kFull : BlockKind::kPartial;
        }
  return kinds;
}

bool parse_ints(const std::string& args, int n, int* out) {
  int i = 0;
  for (size_t start = 0; start <= args.size(); ++i) {  // "a,b": the items between commas
    const size_t comma = std::min(args.find(',', start), args.size());
    const std::string item = args.substr(start, comma - start);
    if (i == n || item.empty() || item.size() > 10 ||
        item.find_first_not_of("0123456789") != std::string::npos)  // digits only, as mods.py takes them
      return false;
    const long long v = std::stoll(item);
    if (v > (1 << 30)) return false;
    out[i] = int(v);
    start = comma + 1;
  }
  return i == n;
}

}  // namespace

int64_t BlockMask::visited_pairs() const {
  int64_t pairs = 0;
  auto add = [&](const std::vector<int32_t>& count, const std::vector<int32_t>& index, int64_t r, int m) {
    for (int i = 0; i < count[r]; ++i) {
      const int n = index[r * n_blocks + i];
      pairs += int64_t(std::min(Nq, (m + 1) * block_q) - m * block_q) *
               (std::min(Nk, (n + 1) * block_kv) - n * block_kv);
    }
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int m = 0; m < m_blocks; ++m) {
        add(kv_count, kv_index, row(b, h, m), m);
        add(full_count, full_index, row(b, h, m), m);
      }
  return pairs;
}

BlockMask block_mask_from_kinds(const std::vector<BlockKind>& kinds, int B, int H, int Nq, int Nk, int block_q,
                                int block_kv) {
  BlockMask bm = empty_mask(B, H, Nq, Nk, block_q, block_kv);
  const size_t rows = size_t(B) * H * bm.m_blocks;
  bm.kv_count.assign(rows, 0);
  bm.full_count.assign(rows, 0);
  bm.kv_index.assign(rows * bm.n_blocks, 0);
  bm.full_index.assign(rows * bm.n_blocks, 0);
  for (size_t r = 0; r < rows; ++r)
    for (int n = 0; n < bm.n_blocks; ++n) {
      const BlockKind kind = kinds[r * bm.n_blocks + n];
      if (kind == BlockKind::kPartial) bm.kv_index[r * bm.n_blocks + bm.kv_count[r]++] = n;
      if (kind == BlockKind::kFull) bm.full_index[r * bm.n_blocks + bm.full_count[r]++] = n;
    }
  fill_transpose(bm);
  return bm;
}

void fill_transpose(BlockMask& bm) {
  const size_t cols = size_t(bm.B) * bm.H * bm.n_blocks;
  bm.q_count.assign(cols, 0);
  bm.full_q_count.assign(cols, 0);
  bm.q_index.assign(cols * bm.m_blocks, 0);
  bm.full_q_index.assign(cols * bm.m_blocks, 0);
  auto spread = [&](const std::vector<int32_t>& count, const std::vector<int32_t>& index,
                    std::vector<int32_t>& t_count, std::vector<int32_t>& t_index, int b, int h, int m) {
    const int64_t r = bm.row(b, h, m);
    for (int i = 0; i < count[r]; ++i) {
      const int64_t c = bm.col(b, h, index[r * bm.n_blocks + i]);
      t_index[c * bm.m_blocks + t_count[c]++] = m;  // m ascends: so do the transposed lists
    }
  };
  for (int b = 0; b < bm.B; ++b)
    for (int h = 0; h < bm.H; ++h)
      for (int m = 0; m < bm.m_blocks; ++m) {
        spread(bm.kv_count, bm.kv_index, bm.q_count, bm.q_index, b, h, m);
        spread(bm.full_count, bm.full_index, bm.full_q_count, bm.full_q_index, b, h, m);
      }
}

BlockMask block_mask_from_mod(const MaskMod& mod, int B, int H, int Nq, int Nk, int block_q, int block_kv) {
  const BlockMask shape = empty_mask(B, H, Nq, Nk, block_q, block_kv);
  return block_mask_from_kinds(classify(shape, [&](int b, int h, int q, int k) { return mod(b, h, q, k); }), B, H,
                               Nq, Nk, block_q, block_kv);
}

BlockMask block_mask_from_dense(const std::vector<uint8_t>& keep, int mask_B, int mask_H, int B, int H, int Nq,
                                int Nk, int block_q, int block_kv) {
  const BlockMask shape = empty_mask(B, H, Nq, Nk, block_q, block_kv);
  auto at = [&](int b, int h, int q, int k) {
    const int64_t head = int64_t(mask_B == 1 ? 0 : b) * mask_H + (mask_H == 1 ? 0 : h);
    return keep[(head * Nq + q) * Nk + k] != 0;
  };
  return block_mask_from_kinds(classify(shape, at), B, H, Nq, Nk, block_q, block_kv);
}

BlockKind listed_kind(const BlockMask& bm, int b, int h, int m, int n) {
  const int64_t r = bm.row(b, h, m);
  const int32_t* part = bm.kv_index.data() + r * bm.n_blocks;
  const int32_t* full = bm.full_index.data() + r * bm.n_blocks;
  if (std::binary_search(full, full + bm.full_count[r], n)) return BlockKind::kFull;
  if (std::binary_search(part, part + bm.kv_count[r], n)) return BlockKind::kPartial;
  return BlockKind::kEmpty;
}

std::string block_mask_invalid(const BlockMask& bm, int B, int H, int Nq, int Nk) {
  if (bm.block_q <= 0 || bm.block_kv <= 0) return "block sizes must be positive";
  if (bm.B != B || bm.H != H || bm.Nq != Nq || bm.Nk != Nk)
    return "block mask made for B=" + std::to_string(bm.B) + " H=" + std::to_string(bm.H) + " Nq=" +
           std::to_string(bm.Nq) + " Nk=" + std::to_string(bm.Nk) + ", not this problem's";
  if (bm.m_blocks != ceil_div(Nq, bm.block_q) || bm.n_blocks != ceil_div(Nk, bm.block_kv))
    return "block counts do not match the lengths and block sizes";
  const size_t rows = size_t(B) * H * bm.m_blocks, cols = size_t(B) * H * bm.n_blocks;
  if (bm.kv_count.size() != rows || bm.full_count.size() != rows || bm.kv_index.size() != rows * bm.n_blocks ||
      bm.full_index.size() != rows * bm.n_blocks || bm.q_count.size() != cols || bm.full_q_count.size() != cols ||
      bm.q_index.size() != cols * bm.m_blocks || bm.full_q_index.size() != cols * bm.m_blocks)
    return "list tensors of the wrong size";
  auto list_ok = [](const int32_t* idx, int count, int limit) {
    if (count < 0 || count > limit) return false;
    for (int i = 0; i < count; ++i)
      if (idx[i] < 0 || idx[i] >= limit || (i > 0 && idx[i] <= idx[i - 1])) return false;
    return true;
  };
  for (size_t r = 0; r < rows; ++r) {
    const int32_t* part = bm.kv_index.data() + r * bm.n_blocks;
    const int32_t* full = bm.full_index.data() + r * bm.n_blocks;
    if (!list_ok(part, bm.kv_count[r], bm.n_blocks) || !list_ok(full, bm.full_count[r], bm.n_blocks))
      return "a key-block list with a count or an index out of range, or not ascending";
    for (int i = 0; i < bm.kv_count[r]; ++i)
      if (std::binary_search(full, full + bm.full_count[r], part[i])) return "a key block both partial and full";
  }
  for (size_t c = 0; c < cols; ++c)
    if (!list_ok(bm.q_index.data() + c * bm.m_blocks, bm.q_count[c], bm.m_blocks) ||
        !list_ok(bm.full_q_index.data() + c * bm.m_blocks, bm.full_q_count[c], bm.m_blocks))
      return "a query-block list with a count or an index out of range, or not ascending";
  BlockMask t = bm;
  fill_transpose(t);
  for (size_t c = 0; c < cols; ++c)
    for (int i = 0; i < bm.m_blocks; ++i) {
      const bool in_part = i < bm.q_count[c], in_full = i < bm.full_q_count[c];
      if (bm.q_count[c] != t.q_count[c] || bm.full_q_count[c] != t.full_q_count[c] ||
          (in_part && bm.q_index[c * bm.m_blocks + i] != t.q_index[c * bm.m_blocks + i]) ||
          (in_full && bm.full_q_index[c * bm.m_blocks + i] != t.full_q_index[c * bm.m_blocks + i]))
        return "the backward's query-block lists are not the transpose of the forward's";
    }
  return "";
}

// ---- specs -------------------------------------------------------------------------
std::string mask_mod_names(bool with_tensor) {
  return std::string("none, causal, sliding_window:L,R, block_diagonal:B, mini_causal:B, prefix_lm:P, "
                     "dilated_sliding_window:W,S, document") + (with_tensor ? ", tensor" : "");
}

std::string score_mod_names(bool with_tensor) {
  return std::string("none, rel_bias, alibi, softcap:C") + (with_tensor ? ", bias" : "");
}

MaskMod parse_mask_mod(const std::string& spec, int Nq, int Nk, std::string& why) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon), args = colon == std::string::npos ? "" : spec.substr(colon + 1);
  MaskMod m;
  m.off = Nk - Nq;
  int v[2] = {0, 0};
  auto need = [&](int n, const char* form) {
    if (parse_ints(args, n, v)) return true;
    why = "mask_mod " + name + " takes " + form + ", got '" + args + "'";
    return false;
  };
  if (name == "none" && args.empty()) {
    m.kind = MaskModKind::kNone;
  } else if (name == "causal" && args.empty()) {
    m.kind = MaskModKind::kCausal;
  } else if (name == "sliding_window") {
    if (!need(2, "LEFT,RIGHT")) return {};
    m.kind = MaskModKind::kSlidingWindow, m.a = v[0], m.b = v[1];
  } else if (name == "block_diagonal" || name == "mini_causal" || name == "prefix_lm") {
    if (!need(1, name == "prefix_lm" ? "P (the prefix length)" : "B (the block, >= 1)")) return {};
    if (name != "prefix_lm" && v[0] < 1) {
      why = "mask_mod " + name + " needs a block >= 1";
      return {};
    }
    m.kind = name == "block_diagonal" ? MaskModKind::kBlockDiagonal
             : name == "mini_causal"  ? MaskModKind::kMiniCausal
                                      : MaskModKind::kPrefixLm;
    m.a = v[0];
  } else if (name == "dilated_sliding_window") {
    if (!need(2, "W,S (window, stride >= 1)")) return {};
    if (v[1] < 1) {
      why = "mask_mod dilated_sliding_window needs a stride >= 1";
      return {};
    }
    m.kind = MaskModKind::kDilatedWindow, m.a = v[0], m.b = v[1];
  } else if (name == "document" && args.empty()) {
    m.kind = MaskModKind::kDocument;  // the caller supplies the ids
  } else if (name == "tensor" && args.empty()) {
    m.kind = MaskModKind::kTensor;  // the caller supplies the words
  } else {
    why = "unknown mask_mod '" + spec + "' (" + mask_mod_names(true) + ")";
    return {};
  }
  if (m.kind == MaskModKind::kBlockDiagonal || m.kind == MaskModKind::kMiniCausal) m.by_a = FastDivmod(m.a);
  if (m.kind == MaskModKind::kDilatedWindow) m.by_b = FastDivmod(m.b);
  return m;
}

ScoreMod parse_score_mod(const std::string& spec, int H, std::string& why) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon), args = colon == std::string::npos ? "" : spec.substr(colon + 1);
  ScoreMod s;
  s.heads = H;
  if (name == "none" && args.empty()) return s;
  if (name == "rel_bias" && args.empty()) {
    s.kind = ScoreModKind::kRelBias;
  } else if (name == "alibi" && args.empty()) {
    s.kind = ScoreModKind::kAlibi;
  } else if (name == "softcap") {
    char* end = nullptr;
    const float c = std::strtof(args.c_str(), &end);
    if (args.empty() || *end != '\0' || !(c > 0.f) || !std::isfinite(c)) {
      why = "score_mod softcap takes C > 0, got '" + args + "'";
      return {};
    }
    s.kind = ScoreModKind::kSoftcap, s.cap = c;
  } else if (name == "bias" && args.empty()) {
    s.kind = ScoreModKind::kBias;  // the caller supplies the tensor
  } else {
    why = "unknown score_mod '" + spec + "' (" + score_mod_names(true) + ")";
    return {};
  }
  return s;
}

std::string mods_missing_tensors(const MaskMod& mask, const ScoreMod& score) {
  if (mask.kind == MaskModKind::kDocument && (mask.doc == nullptr || mask.doc_len < 1))
    return "the document mask_mod without its ids";
  if (mask.kind == MaskModKind::kTensor && mask.bits.data == nullptr) return "the tensor mask_mod without its words";
  if (score.kind == ScoreModKind::kBias && score.bias.data == nullptr) return "the bias score_mod without its tensor";
  return "";
}

std::string mods_unfit(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score) {
  if (std::string why = mods_missing_tensors(mask, score); !why.empty()) return why;
  if (score.kind != ScoreModKind::kBias) return "";
  if (score.nq != p.Nq || score.nk != p.Nk) return "a bias score_mod set for another Nq x Nk";
  if (score.bias_bf16 != (p.dtype == DType::kBFloat16)) return "a bias score_mod of another dtype";
  const BroadcastOperand& d = score.dbias_at;
  const bool shared = (d.stride_b == 0 && p.B > 1) || (d.stride_h == 0 && p.H > 1) || d.head_group > 1 ||
                      (d.stride_q == 0 && p.Nq > 1);
  if (score.dbias != nullptr && shared && !score.dbias_add) return "a broadcast dBias stored, not added";
  return "";
}

std::string mask_mod_name(const MaskMod& m) {
  switch (m.kind) {
    case MaskModKind::kNone: return "none";
    case MaskModKind::kCausal: return "causal";
    case MaskModKind::kSlidingWindow: return "sliding_window:" + std::to_string(m.a) + "," + std::to_string(m.b);
    case MaskModKind::kBlockDiagonal: return "block_diagonal:" + std::to_string(m.a);
    case MaskModKind::kMiniCausal: return "mini_causal:" + std::to_string(m.a);
    case MaskModKind::kPrefixLm: return "prefix_lm:" + std::to_string(m.a);
    case MaskModKind::kDilatedWindow:
      return "dilated_sliding_window:" + std::to_string(m.a) + "," + std::to_string(m.b);
    case MaskModKind::kDocument: return "document";
    case MaskModKind::kTensor: return "tensor";
  }
  return "?";
}

std::string score_mod_name(const ScoreMod& s) {
  switch (s.kind) {
    case ScoreModKind::kNone: return "none";
    case ScoreModKind::kRelBias: return "rel_bias";
    case ScoreModKind::kAlibi: return "alibi";
    case ScoreModKind::kSoftcap: {  // snprintf, not an ostream: iostream formatting segfaults inside
      char c[32];                     // the Python module (python/attnlab_module.cpp)
      std::snprintf(c, sizeof c, "%g", double(s.cap));
      return std::string("softcap:") + c;
    }
    case ScoreModKind::kBias: return "bias";
  }
  return "?";
}

}  // namespace attnlab
