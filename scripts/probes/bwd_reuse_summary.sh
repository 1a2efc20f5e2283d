#!/usr/bin/env bash
# Branch next/bwd-reuse-summary: the backward reads the forward's mask summary
# (DmaBackwardArgs::mask_summary) instead of running its own pre-pass. The
# harness's bwd rows now do so where the forward ran a pre-pass (note: "mask
# summary: the forward's"); --dma-mask-scan in-kernel gives the old rows.
# Before (44f1a1c tables): L=32K bwd 0.3067 ms, 16K 0.1835 ms.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
T="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias --bwd --iters 10 --warmup 2"
r() { timeout 30 $F $T "$@" 2>&1 | grep -E "^ *dmattn bwd" | sed -E 's/ +dmattn bwd: time:/ /' | cut -c1-150; }
echo "32K reuse: $(r --N 32768)"
echo "32K own:   $(r --N 32768 --dma-mask-scan in-kernel)"
echo "16K pipelined fwd + reuse: $(r --N 16384 --dma-mask-scan pipelined)"
echo "16K own (auto fwd in-kernel): $(r --N 16384)"
el rows
timeout 150 $B/test_dmattn_backward > $L/bwd_tests.log 2>&1; el "test_dmattn_backward rc=$? $(tail -1 $L/bwd_tests.log) $(grep -c "forward's" $L/bwd_tests.log) lines"
grep -m12 FAIL $L/bwd_tests.log | cut -c1-220
el done
