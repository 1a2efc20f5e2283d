#!/usr/bin/env bash
# Session 13, fourth probe: where the chunk plan drops the chunks the kernel reads its grid
# chunk-major, so the blocks of dropped chunks start last. Tests, sanitizers,
# then auto (plan) against forced 1 and forced 4, twice; causal and sparse.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
bwd_sanitizers  # the plan shape under memcheck below
P="--B 1 --H 66 --Hkv 66 --N 512 --D 128 --mask ones --bias --bwd --iters 1 --warmup 0 --check"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $F $P > $L/mem_plan.log 2>&1; el "memcheck (plan) rc=$? $(grep -E 'SUMMARY' $L/mem_plan.log)"
$F $P 2>&1 | grep -E "dmattn bwd" | cut -c1-200
dense=$BWD_DENSE
sparse=$BWD_SPARSE
for rep in 1; do
  for D in 128 64; do
    echo "all-active D=$D auto (plan): $(bwd_row $F $dense --D $D)"
    echo "all-active D=$D forced 1:    $(bwd_row $F $dense --D $D --bwd-chunks 1)"
  done
  echo "all-active causal D=128 auto (plan): $(bwd_row $F $dense --D 128 --causal)"
  echo "all-active causal D=128 forced 4:    $(bwd_row $F $dense --D 128 --causal --bwd-chunks 4)"
  echo "top-1024 B=2 L=32768 auto (plan): $(bwd_row $F $sparse --B 2 --N 32768)"
  echo "top-1024 B=2 L=32768 forced 8:    $(bwd_row $F $sparse --B 2 --N 32768 --bwd-chunks 8)"
done
for D in 128 64; do bwd_peers $dense --D $D; done
el done
