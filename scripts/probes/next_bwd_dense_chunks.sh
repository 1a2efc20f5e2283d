#!/usr/bin/env bash
# Branch next/bwd-dense-chunks (written in session 12, not yet run on a GPU):
# the backward's chunk plan — the active slots of every key tile counted after
# the mask pass, and the chunks dropped on the device when they are spread
# evenly. Tests and sanitizers first, then auto (with the plan) against the
# count the host rule launches, forced with --bwd-chunks (= main's behaviour,
# no plan: a forced count skips it), alternating, twice.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
bwd_sanitizers
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 8 --N 2048 --D 128 --mask ones --bias --bwd \
  --iters 1 --warmup 0 --check > $L/race_plan.log 2>&1; el "racecheck (plan, dense) rc=$? $(grep -E 'SUMMARY' $L/race_plan.log)"
# pytest: in the full gpu_check at the session's end
dense=$BWD_DENSE
sparse=$BWD_SPARSE
for rep in 1 2; do
  for D in 128 64; do
    echo "all-active D=$D auto (plan): $(bwd_row $F $dense --D $D)"
    echo "all-active D=$D forced 4:    $(bwd_row $F $dense --D $D --bwd-chunks 4)"
  done
  echo "all-active causal D=128 auto (plan): $(bwd_row $F $dense --D 128 --causal)"
  echo "all-active causal D=128 forced 4:    $(bwd_row $F $dense --D 128 --causal --bwd-chunks 4)"
  echo "top-1024 B=2 L=32768 auto (plan): $(bwd_row $F $sparse --B 2 --N 32768)"
  echo "top-1024 B=2 L=32768 forced 8:    $(bwd_row $F $sparse --B 2 --N 32768 --bwd-chunks 8)"
  echo "top-1024 H=8 Hkv=8 L=16384 auto (plan): $(bwd_row $F $sparse --H 8 --Hkv 8 --N 16384)"
  echo "top-1024 H=8 Hkv=8 L=16384 forced 4:    $(bwd_row $F $sparse --H 8 --Hkv 8 --N 16384 --bwd-chunks 4)"
done
for N in 16384 32768; do echo "top-1024 L=$N auto (no plan: unchanged): $(bwd_row $F $sparse --N $N)"; done
# The issue's reference in the same run: FA2's backward without mask or bias
# ("sdpa(flash) bwd, no mask", added to the harness in session 12), with cuDNN's
# and the others' masked backward.
for D in 128 64; do bwd_peers $dense --D $D; done
el done
