#!/usr/bin/env bash
# Session 23 (c): rung 11's pass 1 as landed after (a) and (b): stage4 issues
# two early chunks after half 0's store (session23_a's placement), every
# chunk as two N = 128 wgmmas; stage2 none (N = 256, as HEAD); no polynomial
# exponentials. ncu of pass 1 (early, ATTNLAB_TWO_PASS_NO_EARLY_MMA=1, HEAD),
# the A/B end to end interleaved, variant tests, sanitizers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
run_test 480 test_gpu_variants 'two-pass*'
ATTNLAB_TWO_PASS_NO_EARLY_MMA=1 run_test 480 test_gpu_variants 'two-pass+stage4'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
p1() {  # p1 LABEL BINARY VARIANT D [ENV=VALUE] : ncu of pass 1
  local label=$1 bin=$2 v=$3 d=$4; shift 4
  echo "$label pass 1: $(env "$@" timeout 90 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $bin \
    --B 1 --H 8 --N 8192 --D $d --variant "$v" --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
}
for i in 1 2; do
  p1 "stage4 D=1024 early" $F two-pass+stage4 1024 X=0
  p1 "stage4 D=1024 no-early" $F two-pass+stage4 1024 ATTNLAB_TWO_PASS_NO_EARLY_MMA=1
  p1 "stage4 D=1024 head" $FO two-pass+stage4 1024 X=0
  p1 "stage2 D=1024 new" $F two-pass+stage2 1024 X=0
  p1 "stage2 D=1024 head" $FO two-pass+stage2 1024 X=0
done
for d in 512 256; do
  p1 "stage4 D=$d early" $F two-pass+stage4 $d X=0
  p1 "stage4 D=$d no-early" $F two-pass+stage4 $d ATTNLAB_TWO_PASS_NO_EARLY_MMA=1
  p1 "stage4 D=$d head" $FO two-pass+stage4 $d X=0
done
el ncu
row() { timeout 60 env "${@:3}" $2 $SHAPE --variant "$1" --iters 20 2>&1 | grep -E "^ *two-pass" | sed -E 's/\[.*\], //' | cut -c1-90; }
ab() {
  SHAPE="$*"
  echo "== $*"
  for r in 1 2 3; do
    echo "head:     $(row 'two-pass*' $FO X=0)"
    echo "new:      $(row 'two-pass*' $F X=0)"
    echo "no-early: $(row 'two-pass+stage4' $F ATTNLAB_TWO_PASS_NO_EARLY_MMA=1)"
  done
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 512
el ab
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers two-pass+stage4 "--Nq 256 --Nk 300 --D 256 --causal" "--Nq 70 --Nk 130 --D 1024 --causal --dtype bf16" "--Nq 300 --Nk 600 --D 128"
el done
