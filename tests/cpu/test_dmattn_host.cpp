// Host-side parts of dynamic-mask attention: broadcast strides, the problem's
// description, and the support checks the harness prints.
#include "dmattn/dmattn.h"
#include "host/device.h"
#include "host/variant.h"
#include "testing.h"

using namespace attnlab;

TEST_CASE(dmattn_broadcast_strides) {
  BroadcastOperand x;
  x.set_shape(2, 4, 100, 300, /*H=*/8);  // 4 = Hkv heads of an H=8 problem
  EXPECT_EQ(x.stride_q, int64_t(300));
  EXPECT_EQ(x.stride_h, int64_t(100 * 300));
  EXPECT_EQ(x.stride_b, int64_t(4 * 100 * 300));
  EXPECT_EQ(x.head_group, 2);  // query head h reads operand head h / 2
  EXPECT_EQ(x.elems(300), int64_t(2) * 4 * 100 * 300);
  BroadcastOperand y;
  y.set_shape(1, 1, 1, 300, 8);  // one row for everything: all strides 0
  EXPECT_EQ(y.stride_b + y.stride_h + y.stride_q, int64_t(0));
  EXPECT_EQ(y.shape_string(300), std::string("(1, 1, 1, 300)"));
}

TEST_CASE(dmattn_unsupported_reasons) {
  DynamicMaskProblem p;
  p.H = 8;
  p.Hkv = 2;
  p.Nq = p.Nk = 128;
  p.D = 128;
  EXPECT_EQ(dma_forward_unsupported(p), std::string(""));
  p.D = 512;
  EXPECT_CONTAINS(dma_forward_unsupported(p), "head dim 512 not in {32, 64, 96, 128, 192, 256}");
  p.D = 64;
  p.Hkv = 3;
  EXPECT_CONTAINS(dma_forward_unsupported(p), "H must be a multiple of Hkv");
  p.Hkv = 2;
  static const uint8_t dummy[1] = {1};
  p.mask.data = dummy;
  p.mask.set_shape(1, 3, 1, p.Nk, p.H);
  EXPECT_CONTAINS(dma_forward_unsupported(p), "mask head dim must be 1, H or Hkv");
  p.mask.set_shape(1, 2, 5, p.Nk, p.H);
  EXPECT_CONTAINS(dma_forward_unsupported(p), "mask query dim must be 1 or Nq");
  p.mask.set_shape(1, 2, p.Nq, p.Nk, p.H);
  p.softcap = -1.f;
  EXPECT_CONTAINS(dma_forward_unsupported(p), "softcap must be >= 0");
}

TEST_CASE(dmattn_split_kv_sizes) {
  DynamicMaskProblem p;
  p.B = 1;
  p.H = 2;
  p.Hkv = 1;
  p.Nq = 1;
  p.Nk = 512 * 1024;
  p.D = 128;
  EXPECT_EQ(dma_forward_workspace_bytes(p, 1), size_t(0));
  EXPECT_EQ(dma_forward_workspace_bytes(p, 8), size_t(8) * 2 * 1 * 129 * 4);  // O and LSE per split and row
  // With a mask the workspace also holds its tile summary: two bits per 64x64
  // tile, rows of 32-bit words; here (1, 1, 1, Nk): 8192 key tiles = 256 words.
  static const uint8_t dummy = 1;
  p.mask.data = &dummy;
  p.mask.set_shape(1, 1, 1, p.Nk, p.H);
  EXPECT_EQ(dma_forward_workspace_bytes(p, 1), size_t(2 * 256 * 4));
  EXPECT_EQ(dma_forward_workspace_bytes(p, 8), size_t(2 * 256 * 4) + size_t(8) * 2 * 1 * 129 * 4);
  p.Nq = 129;  // a per-query mask (1, 2, 129, Nk): 3 query tiles per head; 2 heads
  p.mask.set_shape(1, 2, p.Nq, p.Nk, p.H);
  EXPECT_EQ(dma_forward_workspace_bytes(p, 1), size_t(2 * 2 * 3 * 256 * 4));
  p.mask = BroadcastOperand{};
  p.Nq = 1;
  EXPECT_EQ(dma_resolve_splits(p, 5), 5);                                   // an explicit count is kept
  const int automatic = dma_resolve_splits(p, 0);                            // decoding: split
  EXPECT_TRUE(automatic > 1 && automatic <= 128);
  p.Nq = p.Nk = 32768;  // 512 query blocks per head already fill any GPU
  EXPECT_EQ(dma_resolve_splits(p, 0), 1);
}

// The backward's query chunks: the resolved count and the workspace it needs.
// (The SM count is the device's, 132 without one; the checks hold for >= 8 SMs.)
TEST_CASE(dmattn_backward_chunks) {
  const int sms = device_sm_count();  // the rule's own SM count
  DynamicMaskProblem p;
  p.B = 1;
  p.H = 2;
  p.Hkv = 1;
  p.Nq = p.Nk = 16384;
  p.D = 128;
  p.causal = true;
  EXPECT_EQ(dma_backward_resolve_chunks(p, /*deterministic=*/true, 7), 1);  // deterministic: never chunked
  EXPECT_EQ(dma_backward_resolve_chunks(p, true, 0), 1);
  EXPECT_EQ(dma_backward_resolve_chunks(p, false, 5), 5);  // a forced count is kept
  // With a mask: about 16 (head, query tile) slots per block, at most 64 chunks.
  static const uint8_t dummy = 1;
  p.mask.data = &dummy;
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  // 2 heads x 256 query tiles = 512 slots; 256 key tiles: 32 slots per block
  // where that is at least one block per SM (16 chunks), else 16 (32 chunks).
  const int masked = dma_backward_resolve_chunks(p, false, 0);
  EXPECT_TRUE(masked > 1 && masked <= 32);
  if (sms >= 64 && sms <= 256) EXPECT_EQ(masked, 16);  // (below 64 SMs the grid cap takes over)
  if (sms > 256 && sms <= 528) EXPECT_EQ(masked, 32);
  // Fewer key tiles than SMs (L = 8192 on the H200's 132): 16 slots per block.
  p.Nq = p.Nk = 8192;
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  if (sms > 128 && sms <= 528) EXPECT_EQ(dma_backward_resolve_chunks(p, false, 0), 16);  // 256 slots
  if (sms >= 16 && sms <= 128) EXPECT_EQ(dma_backward_resolve_chunks(p, false, 0), 8);  // 256 / 32
  // The all-active dense shape (B=1 H=8 N=8192, an all-ones mask): 1024 key
  // tiles x heads, 128 slots each -> 4 chunks of 32 (8 of 16 past 1024 SMs).
  p.H = p.Hkv = 8;
  p.causal = false;
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  const int dense = dma_backward_resolve_chunks(p, false, 0);
  EXPECT_TRUE(dense >= 1 && dense <= 8);
  if (sms >= 64 && sms <= 1024) EXPECT_EQ(dense, 4);
  // Without a mask a grid of 1024 blocks is enough for up to 512 SMs: one chunk.
  p.mask = BroadcastOperand{};
  EXPECT_EQ(dma_backward_resolve_chunks(p, false, 0), 1);
  // A small grid without a mask: chunks, at least 4 slots each (32 slots: <= 8).
  p.H = 2;
  p.Hkv = 1;
  p.Nq = p.Nk = 1024;
  const int small = dma_backward_resolve_chunks(p, false, 0);
  EXPECT_TRUE(small > 1 && small <= 8);
  // The workspace: chunks > 1 add the fp32 dK and dV accumulators, nothing else changes.
  const size_t kv = size_t(p.B) * p.Hkv * p.Nk * p.D;
  EXPECT_EQ(dma_backward_workspace_bytes(p, false, 2) - dma_backward_workspace_bytes(p, false, 1), 2 * kv * 4);
  EXPECT_EQ(dma_backward_workspace_bytes(p, false, 7), dma_backward_workspace_bytes(p, false, 2));
  EXPECT_EQ(dma_backward_workspace_bytes(p, true, 7), dma_backward_workspace_bytes(p, true, 1));
  EXPECT_EQ(dma_backward_workspace_bytes(p, false, 0), dma_backward_workspace_bytes(p, false, small));
  EXPECT_EQ(dma_backward_workspace_bytes(p), dma_backward_workspace_bytes(p, false, 0));  // the defaults
}

TEST_CASE(dmattn_block_order) {
  // Every query tile exactly once, in both orders; the zigzag starts at both ends.
  for (int n_m : {1, 2, 3, 4, 5, 8, 63, 64, 129, 512}) {
    for (bool zigzag : {false, true}) {
      std::vector<int> seen(n_m, 0);
      for (int j = 0; j < n_m; ++j) {
        const int m = dma_query_tile_order(j, n_m, zigzag);
        EXPECT_TRUE(m >= 0 && m < n_m);
        if (m >= 0 && m < n_m) ++seen[m];
      }
      for (int m = 0; m < n_m; ++m) EXPECT_EQ(seen[m], 1);
    }
    EXPECT_EQ(dma_query_tile_order(0, n_m, false), n_m - 1);
    EXPECT_EQ(dma_query_tile_order(0, n_m, true), n_m - 1);
    if (n_m > 1) EXPECT_EQ(dma_query_tile_order(1, n_m, true), 0);
  }
}

TEST_CASE(dmattn_mask_scan_rule) {
  // The forward's automatic mask scan: in-kernel only when at most two blocks
  // read each mask byte and a block scans at most 16K keys.
  DynamicMaskProblem p;
  p.B = 1; p.H = 2; p.Hkv = 1; p.Nq = p.Nk = 16384; p.D = 128;
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto), std::string("none"));  // no mask
  static uint8_t byte;
  p.mask.data = &byte;
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);  // shared by the two heads: two readers
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto), std::string("in-kernel"));
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kPrepass), std::string("prepass"));
  p.Nq = p.Nk = 32768;  // rows too long for one block: the pre-pass, pipelined with the forward
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto), std::string("pipelined"));
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto, 2), std::string("in-kernel"));  // 16K keys per split
  p.H = 8;  // eight heads share the mask: the plain pre-pass (measured faster there)
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto), std::string("prepass"));
  p.H = 2;
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kInKernel), std::string("in-kernel"));
  p.Nq = 1; p.Nk = 524288;  // decoding on the tile kernel: 64 splits leave 8K keys per block
  p.mask.set_shape(1, 1, 1, p.Nk, p.H);
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto, 1, DmaCore::kMma), std::string("prepass"));
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto, 64, DmaCore::kMma), std::string("in-kernel"));
  // ... and on the automatic core, the key-gather kernel, which reads its row itself.
  EXPECT_EQ(dma_forward_core_name(p, DmaCore::kAuto), std::string("gather"));
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto, 1), std::string("in-kernel"));
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kPrepass, 64), std::string("in-kernel"));
  EXPECT_EQ(dma_forward_core_name(p, DmaCore::kMma), std::string("mma"));
  p.Nk = 2048;  // a short row: the tile kernel unless the gather kernel is asked for
  EXPECT_EQ(dma_forward_core_name(p, DmaCore::kAuto) != std::string("gather"), true);
  EXPECT_EQ(dma_forward_core_name(p, DmaCore::kGather), std::string("gather"));
  p.Nk = 2049;
  EXPECT_EQ(dma_forward_core_name(p, DmaCore::kAuto), std::string("gather"));
  p.Nk = 524288;
  p.Nq = 2;  // the gather kernel takes one query row only
  EXPECT_EQ(dma_forward_core_name(p, DmaCore::kGather), std::string(""));
  p.H = 8; p.Nq = p.Nk = 4096;  // eight heads share the mask
  p.mask.set_shape(1, 1, p.Nq, p.Nk, p.H);
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto), std::string("prepass"));
  p.mask.set_shape(1, 8, 1, p.Nk, p.H);  // a query-broadcast mask: every query tile reads it
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kAuto), std::string("prepass"));
  // Pipelined only with one split and a mask with rows per query.
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kPipelined), std::string("prepass"));
  p.mask.set_shape(1, 8, p.Nq, p.Nk, p.H);
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kPipelined), std::string("pipelined"));
  EXPECT_EQ(dma_forward_mask_scan_name(p, DmaMaskScan::kPipelined, 4), std::string("prepass"));
}

TEST_CASE(dmattn_prepass_chunk_bounds) {
  // The pipelined pre-pass's chunks: contiguous, every query tile in exactly
  // one, none empty, and about equal shares of the mask bytes read.
  DynamicMaskProblem p;
  p.B = 1; p.H = 2; p.Hkv = 1; p.D = 128;
  for (int causal = 0; causal < 2; ++causal) {
    for (int n : {1, 63, 65, 1000, 32768}) {
      for (int chunks : {1, 2, 3, 8, 16}) {
        p.Nq = p.Nk = n;
        p.causal = causal != 0;
        const int q_tiles = (n + kDmaBr - 1) / kDmaBr;
        const int c = dma_resolve_prepass_chunks(p, chunks);
        EXPECT_EQ(c, std::min(chunks, q_tiles));
        const std::vector<int> b = dma_prepass_chunk_bounds(p, c);
        EXPECT_EQ(int(b.size()), c + 1);
        EXPECT_EQ(b.front(), 0);
        EXPECT_EQ(b.back(), q_tiles);
        for (int i = 0; i < c; ++i) EXPECT_TRUE(b[i] < b[i + 1]);
      }
    }
  }
  EXPECT_EQ(dma_resolve_prepass_chunks(p, 0), kDmaPrepassChunks);
  EXPECT_EQ(dma_resolve_prepass_chunks(p, 99), kDmaMaxPrepassChunks);
  // Causal L = 32K, 8 chunks: tile m reads ~(m + 1) x 64 keys, so the first
  // eighth of the bytes is the first ~512/sqrt(8) = 181 tiles, the last ~33.
  p.Nq = p.Nk = 32768;
  p.causal = true;
  std::vector<int> b = dma_prepass_chunk_bounds(p, 8);
  EXPECT_TRUE(b[1] >= 179 && b[1] <= 183);
  EXPECT_TRUE(512 - b[7] >= 31 && 512 - b[7] <= 35);
  p.causal = false;  // not causal: equal tile counts
  b = dma_prepass_chunk_bounds(p, 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[i + 1] - b[i], 64);
}
