#!/usr/bin/env bash
# Session-6 probe D: the streamed mask pre-pass with its loads in flight in
# shared memory (cp.async ring, one block per SM; a ready flag
# per word, the forward's blocks waiting only for their own words) against
# the pre-pass and the in-kernel scan; tests of all three scans and the bits.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_summary
timeout 120 $B/test_dmattn_summary > $L/summary_tests.log 2>&1; el "test_dmattn_summary rc=$? $(tail -1 $L/summary_tests.log)"; grep -m6 FAIL $L/summary_tests.log | cut -c1-240
timeout 300 $B/test_dmattn > $L/fwd_tests.log 2>&1; el "test_dmattn rc=$? $(tail -1 $L/fwd_tests.log)"; grep -m12 FAIL $L/fwd_tests.log | cut -c1-240
t() { timeout 60 $F "$@" --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn|rror" | sed -E 's/ +dmattn: time:/ /; s/, effective TFLOPS:/ ms /' | cut -c1-40; }
T="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --bias"
for N in 32768 16384 8192; do
  for W in 1024 32; do
    [ $N != 32768 ] && [ $W = 32 ] && continue
    echo "L=$N W=$W: prepass $(t $T --N $N --window $W --dma-mask-scan prepass) | streamed $(t $T --N $N --window $W --dma-mask-scan streamed) | in-kernel $(t $T --N $N --window $W --dma-mask-scan in-kernel) | streamed $(t $T --N $N --window $W --dma-mask-scan streamed)"
  done
done
echo "L=32K W=2048: prepass $(t $T --N 32768 --window 2048 --dma-mask-scan prepass) | streamed $(t $T --N 32768 --window 2048 --dma-mask-scan streamed)"
echo "L=32K D=64: prepass $(t $T --D 64 --N 32768 --window 1024 --dma-mask-scan prepass) | streamed $(t $T --D 64 --N 32768 --window 1024 --dma-mask-scan streamed)"
T8="--B 1 --H 8 --Hkv 1 --D 128 --causal --mask topk --bias --window 1024"
for N in 8192 32768; do echo "H=8 L=$N: prepass $(t $T8 --N $N --dma-mask-scan prepass) | streamed $(t $T8 --N $N --dma-mask-scan streamed)"; done
for d in 128 64; do
  A="--B 1 --H 8 --N 8192 --D $d --mask ones --bias"
  echo "all-ones D=$d: prepass $(t $A --dma-mask-scan prepass) | streamed $(t $A --dma-mask-scan streamed) | causal prepass $(t $A --causal --dma-mask-scan prepass) | causal streamed $(t $A --causal --dma-mask-scan streamed)"
done
echo "memcheck streamed: $(timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $F --B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 1300 --D 64 --causal --mask topk --window 100 --bias --dma-mask-scan streamed --check --iters 1 --warmup 0 2>&1 | grep -E 'ERROR SUMMARY|FAIL|PASS' | cut -c1-60 | tr '\n' ' ')"
echo "mma core L=32K: prepass $(t $T --N 32768 --window 1024 --dma-core mma --dma-mask-scan prepass) | streamed $(t $T --N 32768 --window 1024 --dma-core mma --dma-mask-scan streamed)"
M="--clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread"
timeout 100 ncu $M -k regex:"mask_summary|dma_forward_kernel" --launch-skip 2 --launch-count 2 $F $T --N 32768 --window 1024 --dma-mask-scan streamed --iters 1 --warmup 0 > $L/ncu_streamed.txt 2>&1
el "ncu streamed rc=$?"; grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__bytes|grid_size|registers" $L/ncu_streamed.txt | sed 's/(DynamicMaskProblem.*//; s/(const T2.*//' | cut -c1-110
$F $T --N 32768 --window 1024 --dma-mask-scan streamed --sdpa --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|sdpa)" | cut -c1-150
el done
tar czf $O/logs.tgz -C /tmp logs
