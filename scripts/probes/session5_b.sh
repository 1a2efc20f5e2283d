#!/usr/bin/env bash
# Session-5 probe B: the forward's in-kernel mask scan (DmaMaskScan::kInKernel,
# branch next/in-kernel-scan): tests (every mask case on both scans), the
# pre-pass test (its kernel now calls the shared scan), sanitizer, and
# in-kernel against pre-pass timings; an ncu look at the wgmma backward.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_summary
run_test 100 test_dmattn_summary
timeout 300 $B/test_dmattn > $L/fwd_tests.log 2>&1; el "test_dmattn rc=$? $(head -1 $L/fwd_tests.log | cut -c1-150) $(tail -1 $L/fwd_tests.log)"; grep -m12 FAIL $L/fwd_tests.log | cut -c1-240
for tool in memcheck racecheck; do
  for shape in "--Nq 200 --Nk 1000 --D 128 --Hkv 1 --causal --mask topk --window 48 --bias" \
               "--Nq 130 --Nk 2333 --D 64 --mask topk --window 64 --bias" \
               "--Nq 77 --Nk 3001 --D 96 --causal --mask topk --window 64" \
               "--Nq 1 --Nk 5000 --D 128 --Hkv 1 --mask topk --window 64 --bias --splits 4"; do
    r=$(timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 $shape --dma-mask-scan in-kernel --check --iters 1 --warmup 0 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAIL" | head -3 | tr '\n' ' ')
    el "$tool [$shape]: $r"
  done
done
D="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"
for N in 32768 16384; do
  for s in in-kernel prepass in-kernel prepass; do
    $F $D --N $N --dma-mask-scan $s --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-100 | sed "s/^/L=$N $s /"
  done
done
$F $D --N 32768 --sdpa --iters 5 --warmup 1 2>&1 | grep -E "^ *(dmattn|sdpa|torch)" | cut -c1-150
for Nk in 32768 524288; do
  for s in in-kernel prepass; do
    $F $D --block 0 --Nq 1 --Nk $Nk --dma-mask-scan $s --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-100 | sed "s/^/Nk=$Nk $s /"
  done
done
el "all-ones + bias, H=8 N=8192 (8 heads share the mask: auto = prepass)"
for d in 128 64; do
  for s in prepass in-kernel; do
    $F --B 1 --H 8 --N 8192 --D $d --mask ones --bias --dma-mask-scan $s --iters 10 --warmup 2 2>&1 | grep -E "^ *dmattn" | cut -c1-100 | sed "s/^/D=$d $s /"
  done
done
$F --B 1 --H 8 --N 8192 --D 64 2>&1 | grep -E "split-q\+stage2" | head -2
el "H=8 Hkv=8 topk per-head mask (readers 1)"
for s in in-kernel prepass; do
  $F --B 1 --H 8 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan $s --iters 10 --warmup 2 2>&1 | grep -E "^ *dmattn" | cut -c1-100 | sed "s/^/H8 $s /"
done
el "ncu: the wgmma backward, all-ones + bias D=128 H=8 N=4096"
timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis -k regex:"dma_bwd_(kernel|dq)" --launch-count 2 $F --B 1 --H 8 --N 4096 --D 128 --mask ones --bias --bwd --iters 1 --warmup 0 > $L/ncu_bwd.txt 2>&1; el "ncu rc=$?"
grep -E "^  [a-z_].*\(|Duration|Registers Per|Achieved Occ|Theoretical Occ|Compute \(SM\) Thr|Memory Thr|Stall|Warp Cycles Per Issued|Block Limit|Dynamic Shared" $L/ncu_bwd.txt | cut -c1-130 | head -60
el done
tar czf $O/logs.tgz -C /tmp logs
