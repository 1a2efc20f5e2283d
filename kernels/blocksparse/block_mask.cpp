// attnlab: the block mask's reference builders, its transpose and its checks
// (block_mask.h); the mask_mod / score_mod specs' parser, names and lists
// (mods.h), made from the rows of mods_table.h.
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

// ---- specs: the rows of mods_table.h -----------------------------------------------
namespace {

struct MaskModRow {
  MaskModKind kind;
  const char *name, *args, *form;
  int least[2];
  const char* need;
  bool tensor;
};
constexpr MaskModRow kMaskModRows[] = {
#define ATTNLAB_ROW(k, name, args, form, least_a, least_b, need, tensor) \
  {MaskModKind::k, name, args, form, {least_a, least_b}, need, (tensor) != 0},
    ATTNLAB_MASK_MODS(ATTNLAB_ROW)
#undef ATTNLAB_ROW
};
struct ScoreModRow {
  ScoreModKind kind;
  const char *name, *args, *form;
  bool tensor;
};
constexpr ScoreModRow kScoreModRows[] = {
#define ATTNLAB_ROW(k, name, args, form, chain_rule, tensor) {ScoreModKind::k, name, args, form, (tensor) != 0},
    ATTNLAB_SCORE_MODS(ATTNLAB_ROW)
#undef ATTNLAB_ROW
};

// A row's argument count: none for "", else one more than its commas.
constexpr int arg_count(const char* args) {
  int n = *args != '\0' ? 1 : 0;
  for (; *args != '\0'; ++args) n += *args == ',' ? 1 : 0;
  return n;
}
constexpr bool mask_rows_fit() {
  for (const MaskModRow& r : kMaskModRows) {
    const int n = arg_count(r.args);
    if (n > 2 || (n < 2 && r.least[1] != 0) || (n < 1 && r.least[0] != 0) ||
        ((r.least[0] > 0 || r.least[1] > 0) != (*r.need != '\0')) || (n > 0) != (*r.form != '\0') ||
        (n > 0 && r.tensor))
      return false;
  }
  return true;
}
static_assert(mask_rows_fit(), "a mask_mod row: at most two arguments (MaskMod::a, b), a least value only for "
                               "an argument it has, a `need` exactly where one is set, a form where it has "
                               "arguments, and none for a tensor mod");
constexpr bool score_rows_fit() {
  for (const ScoreModRow& r : kScoreModRows) {
    const int n = arg_count(r.args);
    if (n > 1 || (n > 0) != (*r.form != '\0') || (n > 0 && r.tensor)) return false;
  }
  return true;
}
static_assert(score_rows_fit(), "a score_mod row: at most one argument (ScoreMod::cap), a form where it has "
                                "one, and none for a tensor mod");

// The row named `name`, or null.
template <typename Row, size_t N>
const Row* find_row(const Row (&rows)[N], const std::string& name) {
  for (const Row& r : rows)
    if (name == r.name) return &r;
  return nullptr;
}
// The row of `kind`, or null: the rows are in the kinds' order.
template <typename Row, size_t N, typename Kind>
const Row* row_of(const Row (&rows)[N], Kind kind) {
  return size_t(kind) < N ? &rows[size_t(kind)] : nullptr;
}
// "NAME[:ARGS], ..." of the rows, the tensor mods' only with_tensor.
template <typename Row, size_t N>
std::string spec_list(const Row (&rows)[N], bool with_tensor) {
  std::string list;
  for (const Row& r : rows) {
    if (r.tensor && !with_tensor) continue;
    list += (list.empty() ? "" : ", ") + std::string(r.name) + (*r.args != '\0' ? ":" : "") + r.args;
  }
  return list;
}

}  // namespace

std::string mask_mod_names(bool with_tensor) { return spec_list(kMaskModRows, with_tensor); }

std::string score_mod_names(bool with_tensor) { return spec_list(kScoreModRows, with_tensor); }

MaskMod parse_mask_mod(const std::string& spec, int Nq, int Nk, std::string& why) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon), args = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const MaskModRow* row = find_row(kMaskModRows, name);
  const int n = row != nullptr ? arg_count(row->args) : 0;
  if (row == nullptr || (n == 0 && !args.empty())) {
    why = "unknown mask_mod '" + spec + "' (" + mask_mod_names(true) + ")";
    return {};
  }
  int v[2] = {0, 0};
  if (n > 0 && !parse_ints(args, n, v)) {
    why = "mask_mod " + name + " takes " + row->form + ", got '" + args + "'";
    return {};
  }
  if (v[0] < row->least[0] || v[1] < row->least[1]) {
    why = "mask_mod " + name + " needs " + row->need;
    return {};
  }
  MaskMod m;
  m.kind = row->kind;  // document's ids and a tensor mask's words: the caller attaches them
  m.off = Nk - Nq;
  m.a = v[0], m.b = v[1];
  if (row->least[0] >= 1) m.by_a = FastDivmod(m.a);  // a divisor
  if (row->least[1] >= 1) m.by_b = FastDivmod(m.b);
  return m;
}

ScoreMod parse_score_mod(const std::string& spec, int H, std::string& why) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon), args = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const ScoreModRow* row = find_row(kScoreModRows, name);
  const int n = row != nullptr ? arg_count(row->args) : 0;
  if (row == nullptr || (n == 0 && !args.empty())) {
    why = "unknown score_mod '" + spec + "' (" + score_mod_names(true) + ")";
    return {};
  }
  ScoreMod s;
  s.kind = row->kind;  // a bias: the caller attaches the tensor
  s.heads = H;
  if (n > 0) {
    char* end = nullptr;
    const float c = std::strtof(args.c_str(), &end);
    if (args.empty() || *end != '\0' || !(c > 0.f) || !std::isfinite(c)) {
      why = "score_mod " + name + " takes " + row->form + ", got '" + args + "'";
      return {};
    }
    s.cap = c;
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
  const MaskModRow* row = row_of(kMaskModRows, m.kind);
  if (row == nullptr) return "?";
  const int n = arg_count(row->args);
  return row->name + (n > 0 ? ":" + std::to_string(m.a) : "") + (n > 1 ? "," + std::to_string(m.b) : "");
}

std::string score_mod_name(const ScoreMod& s) {
  const ScoreModRow* row = row_of(kScoreModRows, s.kind);
  if (row == nullptr) return "?";
  if (arg_count(row->args) == 0) return row->name;
  char c[32];  // snprintf, not an ostream: iostream formatting segfaults inside the Python
               // module (python/attnlab_module.cpp)
  std::snprintf(c, sizeof c, "%g", double(s.cap));
  return std::string(row->name) + ":" + c;
}

}  // namespace attnlab
