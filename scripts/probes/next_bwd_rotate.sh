#!/usr/bin/env bash
# For the next session (written in session 13, not yet run on a GPU): the
# backward's query tiles walked from per-key-tile offsets (--bwd-rotate,
# DmaBackwardArgs::rotate_slots). Hypothesis: the key tiles' blocks of one
# head run in step (uniform work), so at any time ~128 of them reduce their
# dQ tile into the *same* query tile's 32 KiB (64 x 128 fp32) — the L2
# serialises same-address reductions; key tile j starting at query tile j
# spreads them over all query tiles. Tests (test_dmattn_backward: 20 rotated
# cases per dtype x causal x core), sanitizers on a rotated shape, then
# rotated against not, alternating, twice, with FA2's backward in the same run.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
grep -c "slots rotated" $L/test_dmattn_backward.log
S="--B 1 --H 2 --Nq 200 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 48 --bias --bwd --bwd-rotate --iters 1 --warmup 0 --check"
for tool in racecheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F $S > $L/san.log 2>&1
  el "$tool (rotated) rc=$? $(grep -E 'SUMMARY' $L/san.log)"
done
$F $S 2>&1 | grep -E "dmattn bwd" | cut -c1-160
for rep in 1 2; do
  for D in 128 64; do
    echo "all-active D=$D:          $(bwd_row $F $BWD_DENSE --D $D)"
    echo "all-active D=$D rotated:  $(bwd_row $F $BWD_DENSE --D $D --bwd-rotate)"
  done
  echo "all-active causal D=128:          $(bwd_row $F $BWD_DENSE --D 128 --causal)"
  echo "all-active causal D=128 rotated:  $(bwd_row $F $BWD_DENSE --D 128 --causal --bwd-rotate)"
  echo "top-1024 L=16K:          $(bwd_row $F $BWD_SPARSE --N 16384)"
  echo "top-1024 L=16K rotated:  $(bwd_row $F $BWD_SPARSE --N 16384 --bwd-rotate)"
done
for D in 128 64; do bwd_peers $BWD_DENSE --D $D --bwd-rotate; done
el done
