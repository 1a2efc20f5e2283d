#!/usr/bin/env bash
# Session-4 probe B: the dynamic-mask forward after the branch-free score
# epilogue — its tests, the all-ones (+bias) ratio to rung 02, the sparse
# training shapes, and ncu per-SASS stall samples of the dense loop.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn ${EXTRA_TARGETS:-}
run_test 240 test_dmattn
for a in "--H 8 --N 8192 --D 128 --mask ones" "--H 8 --N 8192 --D 128 --mask ones --bias" "--H 8 --N 8192 --D 128 --mask ones --bias --dma-core mma" \
         "--H 8 --N 8192 --D 64 --mask ones --bias" "--H 8 --N 8192 --D 64 --mask ones --bias --dma-core mma" \
         "--H 8 --N 8192 --D 128 --mask ones --bias --dtype bf16" "--H 8 --N 8192 --D 128 --mask ones --bias --causal" \
         "--H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias" "--H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-core mma" \
         "--H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias" "--H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias"; do
  echo "== $a"; timeout 90 $F --B 1 $a --iters 10 --warmup 2 ${BENCH_PEERS:-} 2>&1 | grep -E "^ *(dmattn|split-q|sdpa|torch)" | cut -c1-200
done
el benches
NCU="timeout 120 ncu --clock-control none --import-source no --section WarpStateStats --section SourceCounters --section SpeedOfLight --launch-count 1"
$NCU -k regex:dma_forward_kernel -o $L/fwd $F --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --iters 1 --warmup 0 > $L/ncu_fwd.log 2>&1
ncu -i $L/fwd.ncu-rep --page source --csv --print-source sass > $O/fwd_sass.csv 2>$L/fwd_src.err || head -3 $L/fwd_src.err
ncu -i $L/fwd.ncu-rep --page details 2>&1 | grep -E "Duration|Registers Per|Warp Cycles Per Issued|Compute \(SM\)" | cut -c1-150
el ncu
tar czf $O/logs.tgz -C /tmp logs
