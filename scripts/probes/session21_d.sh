#!/usr/bin/env bash
# Session 21 (d): the staggered pass 1 after session21_c's trace (epilogue
# parts ~850 cycles against 512 of the other accumulator's MMAs; the mask's
# compares and selects ran on every tile): unmasked tiles now take a copy of
# the epilogue without them. Rows of this probe's build only: the epilogue
# spread over k = 2, 4, 8 steps, and 1 or 2 step groups of MMAs left in flight
# (+kKwW); the landed build (HEAD) beside it. Variant tests, ncu's pass 1, A/B.
# Its tree: the landed one with scripts/probes/next_rung11_staggered.patch applied.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
run_test 420 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
for v in 'two-pass+stage4' 'two-pass+stage4+k4w2' 'two-pass+stage4+k8w2' 'two-pass+stage4+k2w2' 'two-pass+stage4+k8w1'; do
  echo "$v: $(timeout 60 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $F --B 1 --H 8 --N 8192 --D 1024 --variant "$v" --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" | awk '{print $NF}' | tr '\n' ' ')"
done
[ -n "$FO" ] && echo "old stage4: $(timeout 60 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $FO --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" | awk '{print $NF}' | tr '\n' ' ')"
el ncu
ab() {
  echo "new: $*"; timeout 90 $F "$@" --variant 'two-pass*' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-110
  [ -n "$FO" ] && { echo "old:"; timeout 60 $FO "$@" --variant 'two-pass+stage4' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-110; }
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 512
ab --B 1 --H 8 --N 8192 --D 256
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 1024
el done
