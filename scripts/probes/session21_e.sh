#!/usr/bin/env bash
# Session 21 (e): the landed pass 1 with each half's P̃ computed just before it
# is written (half 1's exponentials under the TMA engine's read of half 0,
# which the second half's writes wait for), against the landed build (HEAD)
# beside it. Variant tests, ncu's pass 1 of both, A/B, sanitizers.
# Its tree: the landed one with scripts/probes/next_rung11_store_overlap.patch applied.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
run_test 420 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
p1() { echo "$1 pass 1: $(timeout 60 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $2 --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" | awk '{print $NF}' | tr '\n' ' ')"; }
p1 new $F; [ -n "$FO" ] && p1 old $FO; p1 new $F; [ -n "$FO" ] && p1 old $FO
el ncu
ab() {
  echo "new: $*"; timeout 60 $F "$@" --variant 'two-pass+stage4' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-110
  [ -n "$FO" ] && { echo "old:"; timeout 60 $FO "$@" --variant 'two-pass+stage4' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-110; }
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 512
ab --B 1 --H 8 --N 8192 --D 256
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 1024
el ab
variant_sanitizers 'two-pass+stage4'
el done
