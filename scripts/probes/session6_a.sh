#!/usr/bin/env bash
# Session-6 probe A: the forward's mask pairs issued with the bias (before the
# K/V wait) instead of after the MMAs; where the L = 32K forward's time goes
# (ncu per kernel, empty W = 32 against W = 1024); decoding split counts.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
T="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --bias"
for W in 32 256 1024 2048; do echo "L=32K W=$W: $(dm_time $T --N 32768 --window $W) | again $(dm_time $T --N 32768 --window $W)"; done
echo "L=16K W=1024: $(dm_time $T --N 16384 --window 1024)   L=8K: $(dm_time $T --N 8192 --window 1024)"
echo "L=32K W=1024 in-kernel: $(dm_time $T --N 32768 --window 1024 --dma-mask-scan in-kernel)"
for s in 0 64 256 512; do
  sp=""; [ $s != 0 ] && sp="--splits $s"
  echo "decode 512K splits=${s:-auto}: $(dm_time $T --window 1024 --block 0 --Nq 1 --Nk 524288 $sp)"
done
echo "decode 32K: $(dm_time $T --window 1024 --block 0 --Nq 1 --Nk 32768)"
for d in 128 64; do echo "all-ones D=$d: $(dm_time --B 1 --H 8 --N 8192 --D $d --mask ones --bias)"; done
M="--clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size"
for W in 32 1024; do
  timeout 100 ncu --clock-control none $M -k regex:"mask_summary|dma_forward_kernel" --launch-skip 2 --launch-count 2 $F $T --N 32768 --window $W --iters 1 --warmup 0 > $L/ncu_w$W.txt 2>&1
  el "ncu W=$W rc=$?"; grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__bytes|warps_active|grid_size" $L/ncu_w$W.txt | sed 's/(int, int, int)//' | cut -c1-110
done
timeout 100 ncu --clock-control none $M -k regex:"dma_forward_kernel|dma_combine" --launch-skip 2 --launch-count 2 $F $T --window 1024 --block 0 --Nq 1 --Nk 524288 --iters 1 --warmup 0 > $L/ncu_dec.txt 2>&1
el "ncu decode rc=$?"; grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__bytes|warps_active|grid_size" $L/ncu_dec.txt | cut -c1-110
timeout 120 ncu --clock-control none --section WarpStateStats --section Occupancy -k regex:"dma_forward_kernel" --launch-skip 1 --launch-count 1 $F $T --N 32768 --window 1024 --iters 1 --warmup 0 > $L/ncu_fwd_stalls.txt 2>&1
grep -E "Stall|Warp Cycles|Achieved Occ|Duration" $L/ncu_fwd_stalls.txt | cut -c1-110
$F $T --N 32768 --window 1024 --sdpa --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|sdpa)" | cut -c1-150
el done
tar czf $O/logs.tgz -C /tmp logs
