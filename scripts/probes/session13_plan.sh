#!/usr/bin/env bash
# Session 13: the backward's chunk plan (dma_backward_plans_chunks), A/B on the
# device. Tests (two large cases take the plan), the backward's sanitizers and
# memcheck + --check on a plan shape, then the automatic count (plan) against
# forced counts (no plan), alternating, REPS times, on the all-active shape
# (D = 128, 64), all-active causal and top-1024 B=2 L=32K (plans, keeps its
# chunks); the torch peers and FA2's backward in the same run.
# Ran four times, at d9bbff5, f291615, 4b00776 and 9b35159
# (results/H200/probes/session13_plan{,2,3,4}.txt):
#   d9bbff5  REPS=2 FORCED="4 1"  (no SANITIZE: a racecheck of the plan shape timed out at 150 s instead)
#   f291615  REPS=2 FORCED="1 4"  SANITIZE=1
#   4b00776  REPS=2 FORCED="1"    SANITIZE=1 PEERS_D=128
#   9b35159  REPS=1 FORCED="1"    SANITIZE=1
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
[ "${SANITIZE:-1}" = 1 ] && bwd_sanitizers
P="--B 1 --H 66 --Hkv 66 --N 512 --D 128 --mask ones --bias --bwd --iters 1 --warmup 0 --check"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $F $P > $L/mem_plan.log 2>&1; el "memcheck (plan) rc=$? $(grep -E 'SUMMARY' $L/mem_plan.log)"
$F $P 2>&1 | grep -E "dmattn bwd" | cut -c1-200
for rep in $(seq 1 "${REPS:-1}"); do
  for D in 128 64; do
    echo "all-active D=$D auto (plan): $(bwd_row $F $BWD_DENSE --D $D)"
    for c in ${FORCED:-1}; do echo "all-active D=$D forced $c:    $(bwd_row $F $BWD_DENSE --D $D --bwd-chunks $c)"; done
  done
  echo "all-active causal D=128 auto (plan): $(bwd_row $F $BWD_DENSE --D 128 --causal)"
  echo "all-active causal D=128 forced 4:    $(bwd_row $F $BWD_DENSE --D 128 --causal --bwd-chunks 4)"
  echo "top-1024 B=2 L=32768 auto (plan): $(bwd_row $F $BWD_SPARSE --B 2 --N 32768)"
  echo "top-1024 B=2 L=32768 forced 8:    $(bwd_row $F $BWD_SPARSE --B 2 --N 32768 --bwd-chunks 8)"
done
for D in ${PEERS_D:-128 64}; do bwd_peers $BWD_DENSE --D $D; done
el done
