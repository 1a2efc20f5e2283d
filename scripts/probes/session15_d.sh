#!/usr/bin/env bash
# Session 15, last device call: gpu_check's tests and sanitizers once more
# (SKIP_BENCH=1 NCU=0) with test_gpu_variants now in the background beside
# ctest and the dynamic-mask tests (how long the phase takes now), then the
# three dynamic-mask rows the final run (39ec995) lost to its time limit.
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}
OUT=/tmp/check SKIP_BENCH=1 NCU=0 timeout ${CHECK_S:-400} scripts/gpu_check.sh > $O/check.log 2>&1; echo "gpu_check rc=$?"
grep -E "^(gpu variants|test_dmattn)|tests passed|build failed|error|^=== |rc=[1-9]" $O/check.log | cut -c1-200 | head -40
cp /tmp/check/summary.md $O/check_summary.md
F=build-gpu/flash_attn_mma
for extra in "--D 128 --dma-mask-scan in-kernel" "--D 128 --dma-mask-scan pipelined" "--D 64 --dma-mask-scan pipelined"; do
  timeout 120 $F --B 1 --H 8 --N 8192 --mask ones --bias $extra --torch --sdpa --iters 10 --warmup 2 --csv $O/dmattn_tail.csv 2>&1 |
    tee -a $O/dmattn_tail.txt | grep -E "^ *(dmattn|split-q)" | cut -c1-160
done
