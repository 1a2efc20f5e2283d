#!/usr/bin/env bash
# Session 13, second probe: the chunk plan decided once by the plan kernel's
# last block (5/4 of the mean), dK and dV stored directly where it decides one
# chunk (no accumulator zeroing or sum pass). Tests, sanitizers, then auto
# (plan) against forced 1 and forced 4, twice; causal and sparse shapes; the
# torch peers and FA2's backward in the same run.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
bwd_sanitizers
P="--B 1 --H 66 --Hkv 66 --N 512 --D 128 --mask ones --bias --bwd --iters 1 --warmup 0 --check"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $F $P > $L/mem_plan.log 2>&1; el "memcheck (plan) rc=$? $(grep -E 'SUMMARY' $L/mem_plan.log)"
$F $P 2>&1 | grep -E "dmattn bwd" | cut -c1-200
$F $P --dtype bf16 --D 64 2>&1 | grep -E "dmattn bwd" | cut -c1-200
dense=$BWD_DENSE
sparse=$BWD_SPARSE
for rep in 1 2; do
  for D in 128 64; do
    echo "all-active D=$D auto (plan): $(bwd_row $F $dense --D $D)"
    echo "all-active D=$D forced 1:    $(bwd_row $F $dense --D $D --bwd-chunks 1)"
    echo "all-active D=$D forced 4:    $(bwd_row $F $dense --D $D --bwd-chunks 4)"
  done
  echo "all-active causal D=128 auto (plan): $(bwd_row $F $dense --D 128 --causal)"
  echo "all-active causal D=128 forced 4:    $(bwd_row $F $dense --D 128 --causal --bwd-chunks 4)"
done
echo "top-1024 B=2 L=32768 auto (plan): $(bwd_row $F $sparse --B 2 --N 32768)"
echo "top-1024 H=8 Hkv=8 L=16384 auto (plan): $(bwd_row $F $sparse --H 8 --Hkv 8 --N 16384)"
for N in 16384 32768; do echo "top-1024 L=$N auto (no plan): $(bwd_row $F $sparse --N $N)"; done
for D in 128 64; do bwd_peers $dense --D $D; done
el done
