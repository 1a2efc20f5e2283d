#!/usr/bin/env bash
# Session 22 (a): rung 11's pass 1 in clusters of two row blocks that
# multicast K (each block loads 128 of every chunk's 256 keys for both), with
# the store overlap of session 21 (e) landed under it. Variant tests (a new
# size, 512 x 600, gives causal pairs of unequal length), ncu of pass 1 —
# multicast, the same binary with ATTNLAB_TWO_PASS_NO_MULTICAST=1, and HEAD's
# build — then the A/B end to end, and the sanitizers at a shape whose pairs
# are unequal.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
run_test 480 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum
p1() {  # p1 LABEL BINARY [ENV=VALUE] : ncu of pass 1 at D = 1024
  local label=$1 bin=$2; shift 2
  echo "$label pass 1: $(env "$@" timeout 90 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $bin \
    --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__|lts__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
}
for i in 1 2; do
  p1 multicast $F X=0
  p1 no-multicast $F ATTNLAB_TWO_PASS_NO_MULTICAST=1
  [ -n "$FO" ] && p1 head $FO X=0
done
el ncu
ab() {
  echo "== $*"
  echo "multicast:    $(timeout 60 $F "$@" --variant 'two-pass+stage4' --iters 20 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
  echo "no-multicast: $(ATTNLAB_TWO_PASS_NO_MULTICAST=1 timeout 60 $F "$@" --variant 'two-pass+stage4' --iters 20 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
  [ -n "$FO" ] && echo "head:         $(timeout 60 $FO "$@" --variant 'two-pass+stage4' --iters 20 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 512
ab --B 1 --H 8 --N 8192 --D 256
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 48 --N 16384 --D 512
el ab
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers two-pass+stage4 "--Nq 256 --Nk 300 --D 256 --causal" "--Nq 512 --Nk 600 --D 1024 --causal" "--Nq 70 --Nk 130 --D 1024 --causal"
el done
