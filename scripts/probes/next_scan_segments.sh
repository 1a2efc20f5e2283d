#!/usr/bin/env bash
# For the next session (written in session 13, not yet run on a GPU): the
# forward's in-kernel mask scan in segments (--dma-scan-segments W, the wgmma
# core, one split). Hypothesis: on the all-ones + bias shape at D = 64 every
# block of a wave reads its 512 KiB of mask rows at the same time before any
# computes (uniform work keeps the waves in step), ~50 us per wave x 2.6 waves
# = the ~130 us the mask adds over the kernel alone (0.678 against 0.546 ms);
# scanning one 32-tile word at a time between computed segments, the first
# segment 1-2 words by block, should spread the reads under other blocks'
# tiles. Tests first (test_dmattn: 48 segmented cases), the sanitizers on a
# segmented shape, then the calls, alternating, twice.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
grep -c "segments of" $L/test_dmattn.log
S="--B 1 --H 2 --Nq 130 --Nk 5000 --D 64 --Hkv 1 --causal --mask topk --window 300 --bias --dma-mask-scan in-kernel --dma-scan-segments 1 --iters 1 --warmup 0 --check"
for tool in racecheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F $S > $L/san.log 2>&1
  el "$tool (segments) rc=$? $(grep -E 'SUMMARY' $L/san.log)"
done
$F $S 2>&1 | grep -E "^ *dmattn:" | cut -c1-160
A="--B 1 --H 8 --N 8192 --mask ones --bias"
for rep in 1 2; do
  for D in 64 128; do
    echo "all-ones D=$D in-kernel:            $(dm_time $A --D $D --dma-mask-scan in-kernel)"
    echo "all-ones D=$D in-kernel, segments 1: $(dm_time $A --D $D --dma-mask-scan in-kernel --dma-scan-segments 1)"
    echo "all-ones D=$D in-kernel, segments 2: $(dm_time $A --D $D --dma-mask-scan in-kernel --dma-scan-segments 2)"
    echo "all-ones D=$D prepass:              $(dm_time $A --D $D --dma-mask-scan prepass)"
    echo "all-ones D=$D pipelined:            $(dm_time $A --D $D --dma-mask-scan pipelined)"
  done
  T="--B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan in-kernel"
  echo "top-1024 L=16K in-kernel:            $(dm_time $T)"
  echo "top-1024 L=16K in-kernel, segments 1: $(dm_time $T --dma-scan-segments 1)"
done
# The dense rung and the torch peers on the D = 64 shape, same process.
timeout 120 $F $A --D 64 --dma-mask-scan in-kernel --dma-scan-segments 1 --sdpa --torch --iters 20 --warmup 3 2>&1 |
  grep -E "dmattn|split-q|sdpa|torch" | cut -c1-150
el done
