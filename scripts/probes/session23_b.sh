#!/usr/bin/env bash
# (The tree it ran on: 4f0dfc2 + scripts/probes/session23_b.patch.)
# Session 23 (b): rung 11's pass 1 with the early MMAs issued right after half
# 0 is packed (before its stmatrix and store), as two N = 128 wgmmas per
# chunk everywhere, no polynomial exponentials (session23_a: no gain). How
# many early chunks: ncu of pass 1 with ATTNLAB_TWO_PASS_EARLY_CHUNKS = 0..4
# (stage4) and 0..2 (stage2), against HEAD; the A/B end to end, interleaved
# three times; variant tests at the default and at 0; sanitizers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
run_test 480 test_gpu_variants 'two-pass*'
ATTNLAB_TWO_PASS_EARLY_CHUNKS=0 run_test 480 test_gpu_variants 'two-pass*'
ATTNLAB_TWO_PASS_EARLY_CHUNKS=4 run_test 480 test_gpu_variants 'two-pass+stage4'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
p1() {  # p1 LABEL BINARY VARIANT D [ENV=VALUE] : ncu of pass 1
  local label=$1 bin=$2 v=$3 d=$4; shift 4
  echo "$label pass 1: $(env "$@" timeout 90 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $bin \
    --B 1 --H 8 --N 8192 --D $d --variant "$v" --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
}
for i in 1 2; do
  for e in 0 1 2 3 4; do p1 "stage4 D=1024 early=$e" $F two-pass+stage4 1024 ATTNLAB_TWO_PASS_EARLY_CHUNKS=$e; done
  p1 "stage4 D=1024 head" $FO two-pass+stage4 1024 X=0
  for e in 0 1 2; do p1 "stage2 D=1024 early=$e" $F two-pass+stage2 1024 ATTNLAB_TWO_PASS_EARLY_CHUNKS=$e; done
  p1 "stage2 D=1024 head" $FO two-pass+stage2 1024 X=0
done
for e in 0 2 4; do p1 "stage4 D=512 early=$e" $F two-pass+stage4 512 ATTNLAB_TWO_PASS_EARLY_CHUNKS=$e; done
p1 "stage4 D=512 head" $FO two-pass+stage4 512 X=0
for e in 0 2 4; do p1 "stage4 D=256 early=$e" $F two-pass+stage4 256 ATTNLAB_TWO_PASS_EARLY_CHUNKS=$e; done
p1 "stage4 D=256 head" $FO two-pass+stage4 256 X=0
el ncu
row() { timeout 60 env "${@:3}" $2 $SHAPE --variant "$1" --iters 20 2>&1 | grep -E "^ *two-pass" | sed -E 's/\[.*\], //' | cut -c1-90; }
ab() {
  SHAPE="$*"
  echo "== $*"
  for r in 1 2 3; do
    echo "head:    $(row 'two-pass+stage4' $FO X=0)"
    echo "early=2: $(row 'two-pass+stage4' $F X=0)"
    echo "early=0: $(row 'two-pass+stage4' $F ATTNLAB_TWO_PASS_EARLY_CHUNKS=0)"
    echo "early=4: $(row 'two-pass+stage4' $F ATTNLAB_TWO_PASS_EARLY_CHUNKS=4)"
  done
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 1024 --causal
el ab
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers two-pass+stage4 "--Nq 256 --Nk 300 --D 256 --causal" "--Nq 70 --Nk 130 --D 1024 --causal --dtype bf16"
SAN_TOOLS='memcheck racecheck' variant_sanitizers two-pass+stage2 "--Nq 256 --Nk 300 --D 128 --causal"
el done
