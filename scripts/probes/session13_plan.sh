#!/usr/bin/env bash
# Session 13: the backward's chunk plan, now that the harness passes the
# requested count (0 = automatic) instead of the resolved one — session 12's
# patch never ran the plan from the harness. Tests (two large cases take the
# plan), sanitizers on a plan shape, then auto (plan) against forced 4 (no plan)
# and forced 1, alternating, twice; sparse shapes; FA2 reference in the same run.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
grep -E "chunk plan applies" $L/test_dmattn_backward.log | head -2
P="--B 1 --H 66 --Hkv 66 --N 512 --D 128 --mask ones --bias --bwd --iters 1 --warmup 0 --check"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $F $P > $L/race_plan.log 2>&1; el "racecheck (plan) rc=$? $(grep -E 'SUMMARY' $L/race_plan.log)"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $F $P > $L/mem_plan.log 2>&1; el "memcheck (plan) rc=$? $(grep -E 'SUMMARY' $L/mem_plan.log)"
$F $P 2>&1 | grep -E "dmattn bwd" | cut -c1-200
dense=$BWD_DENSE
sparse=$BWD_SPARSE
for rep in 1 2; do
  for D in 128 64; do
    echo "all-active D=$D auto (plan): $(bwd_row $F $dense --D $D)"
    echo "all-active D=$D forced 4:    $(bwd_row $F $dense --D $D --bwd-chunks 4)"
    echo "all-active D=$D forced 1:    $(bwd_row $F $dense --D $D --bwd-chunks 1)"
  done
  echo "all-active causal D=128 auto (plan): $(bwd_row $F $dense --D 128 --causal)"
  echo "all-active causal D=128 forced 4:    $(bwd_row $F $dense --D 128 --causal --bwd-chunks 4)"
  echo "top-1024 B=2 L=32768 auto (plan): $(bwd_row $F $sparse --B 2 --N 32768)"
  echo "top-1024 B=2 L=32768 forced 8:    $(bwd_row $F $sparse --B 2 --N 32768 --bwd-chunks 8)"
  echo "top-1024 H=8 Hkv=8 L=16384 auto (plan): $(bwd_row $F $sparse --H 8 --Hkv 8 --N 16384)"
  echo "top-1024 H=8 Hkv=8 L=16384 forced 4:    $(bwd_row $F $sparse --H 8 --Hkv 8 --N 16384 --bwd-chunks 4)"
done
for N in 16384 32768; do echo "top-1024 L=$N auto (no plan: unchanged): $(bwd_row $F $sparse --N $N)"; done
for D in 128 64; do bwd_peers $dense --D $D; done
el done
