#!/usr/bin/env bash
# Session-4 probe F: the bandwidth rewrite of the mask pre-pass (next/prepass-bw):
# its bit-exact test, the dmattn tests, and its time at L=32K.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_backward test_dmattn_summary
run_test 120 test_dmattn_summary
run_test 240 test_dmattn
run_test 240 test_dmattn_backward
echo "memcheck summary: $(timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_dmattn_summary 2>&1 | grep -E 'ERROR SUMMARY' | tr '\n' ' ')"
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:"mask_summary|dma_forward_kernel" --launch-count 2 $F --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --iters 1 --warmup 0 2>&1 | grep -E "^  [a-z_]+.*\(|gpu__time|dram__" | cut -c1-120
for N in 16384 32768; do
  timeout 90 $F --B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias --bwd --sdpa --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|sdpa|torch)" | cut -c1-160
done
el done
tar czf $O/logs.tgz -C /tmp logs
