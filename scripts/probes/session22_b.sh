#!/usr/bin/env bash
# Session 22 (b): rung 11's pass 1 writes P̃ into sOut with stmatrix (8 per
# half tile per thread instead of 32 four-byte stores), against the landed
# build (HEAD: K multicast + store overlap) beside it. Variant tests, ncu of
# pass 1 of both (twice), the A/B end to end, sanitizers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
run_test 480 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
p1() {  # p1 LABEL BINARY : ncu of pass 1 at D = 1024
  echo "$1 pass 1: $(timeout 90 ncu --clock-control none --metrics $M -k regex:"two_pass_scores" -c 1 $2 \
    --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__|smsp__|l1tex__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
}
for i in 1 2; do p1 stmatrix $F; [ -n "$FO" ] && p1 head $FO; done
el ncu
ab() {
  echo "== $*"
  echo "stmatrix: $(timeout 60 $F "$@" --variant 'two-pass+stage4' --iters 20 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
  [ -n "$FO" ] && echo "head:     $(timeout 60 $FO "$@" --variant 'two-pass+stage4' --iters 20 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 512
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 1024
el ab
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers two-pass+stage4 "--Nq 256 --Nk 300 --D 256 --causal" "--Nq 70 --Nk 130 --D 1024 --causal --dtype bf16"
el done
