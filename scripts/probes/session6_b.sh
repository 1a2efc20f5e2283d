#!/usr/bin/env bash
# Session-6 probe B: blocks with no active tile write O = 0 / LSE = -inf and
# exit at once; per-kernel times again; where the forward kernel's warps wait
# (ncu source counters, SASS) for L = 32K top-1024 and decoding Nk = 512K.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
T="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --bias"
for W in 32 1024; do echo "L=32K W=$W: $(dm_time $T --N 32768 --window $W) | again $(dm_time $T --N 32768 --window $W)"; done
echo "decode 512K: $(dm_time $T --window 1024 --block 0 --Nq 1 --Nk 524288)"
M="--clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
for W in 32 1024; do
  timeout 100 ncu --clock-control none $M -k regex:"dma_forward_kernel" --launch-skip 1 --launch-count 1 $F $T --N 32768 --window $W --iters 1 --warmup 0 > $L/ncu_w$W.txt 2>&1
  el "ncu W=$W rc=$? $(grep -E 'gpu__time|warps_active' $L/ncu_w$W.txt | tr -s ' ' | tr '\n' ' ')"
done
S="--clock-control none --section SourceCounters --section WarpStateStats --import-source no"
timeout 150 ncu --clock-control none $S -k regex:"dma_forward_kernel" --launch-skip 1 --launch-count 1 -o $L/rep_w1024 $F $T --N 32768 --window 1024 --iters 1 --warmup 0 > $L/ncu_src_run.txt 2>&1; el "ncu src W=1024 rc=$?"
timeout 150 ncu --clock-control none $S -k regex:"dma_forward_kernel" --launch-skip 1 --launch-count 1 -o $L/rep_dec $F $T --window 1024 --block 0 --Nq 1 --Nk 524288 --iters 1 --warmup 0 >> $L/ncu_src_run.txt 2>&1; el "ncu src decode rc=$?"
for r in w1024 dec; do
  ncu -i $L/rep_$r.ncu-rep --page source --csv --print-source sass > $L/src_$r.csv 2> $L/src_$r.err; el "source page $r: $(wc -l < $L/src_$r.csv) lines $(head -c 300 $L/src_$r.err)"
  ncu -i $L/rep_$r.ncu-rep --print-details all 2>/dev/null | grep -E "Stall|Duration|Warp Cycles" | head -30 > $L/stalls_$r.txt
done
cat $L/stalls_dec.txt | cut -c1-110
obj=$(find $B -name 'dmattn_fwd.cu.o' | head -1)
cuobjdump -sass $obj | awk '/Function : .*dma_forward_kernel.*DmaConfigILi128ELb1EE6__half/{p=1} /Function : /{if(!/DmaConfigILi128ELb1EE6__half/)p=0} p' > $L/sass_fwd128.txt 2>&1; el "sass $(wc -l < $L/sass_fwd128.txt) lines"
el done
tar czf $O/logs.tgz -C /tmp logs
