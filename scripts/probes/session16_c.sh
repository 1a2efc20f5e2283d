#!/usr/bin/env bash
# Session 16: the forward given the mask's tile summary (DmaForwardArgs::
# mask_summary, dma_build_mask_summary). test_dmattn (every masked case once
# more with the summary given: the pass rule and bitwise equality with the
# scanning run), a sanitizer run of the new path, then the forward rows where
# the scan costs most: top-1024 at L = 16K / 32K (issue 5's >= 50x target) and
# the all-ones + bias forward at D = 64 / 128 against the dense rung (>= 0.9x).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 400 test_dmattn
grep -c "summary given" $L/test_dmattn.log
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 --Nq 130 --Nk 300 --D 128 --causal \
    --mask topk --window 150 --bias --check --iters 1 --warmup 0 > $L/san.log 2>&1; rc=$?
  el "$tool rc=$rc $(grep -E 'SUMMARY' $L/san.log) $(grep -c 'summary given' $L/san.log) given rows"
  [ $rc != 0 ] && { grep -v "^=========     " $L/san.log | grep -E "=========|FAIL|rror" | head -12 | cut -c1-200; }
done
row() { timeout 120 $F "$@" --sdpa --torch --iters 10 --warmup 2 2>&1 | grep -E "dmattn|sdpa|torch|dense" | cut -c1-260; }
for L in 16384 32768; do row --B 1 --H 2 --Hkv 1 --N $L --D 128 --causal --mask topk --window 1024 --bias; el "L=$L"; done
row --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias; el "L=32K again"
for D in 64 128; do timeout 120 $F --B 1 --H 8 --N 8192 --D $D --mask ones --bias --iters 10 --warmup 2 2>&1 | grep -E "dmattn|dense" | cut -c1-230; el "ones D=$D"; done
