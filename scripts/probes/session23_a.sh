#!/usr/bin/env bash
# (The tree it ran on: 4f0dfc2 + scripts/probes/session23_a.patch.)
# Session 23 (a): rung 11's pass 1 with (1) the next tile's first two chunks
# issued for keys 0..127 while half 1's exponentials run ("early MMAs"),
# (2) every fourth 8-column fragment's exponentials on the FMA pipe
# (exp2_poly3), and the chunks as two N = 128 wgmmas (ptxas serialises one of
# the two instantiations when N = 256 and N = 128 share registers). Builds:
# F this tree; FB -DATTNLAB_TWO_PASS_HALVES_ALWAYS=0 (N = 256 where it can;
# its stage2 is serialised, compare stage4 only); FC -DATTNLAB_TWO_PASS_POLY_EXP_EVERY=0;
# FO HEAD. Device-math test, variant tests, ncu of pass 1, A/B end to end,
# sanitizers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
flag_build() {  # flag_build DIR "FLAGS" : the harness (no torch) with extra CUDA flags, in DIR
  { cmake -S . -B "$1" -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF "-DCMAKE_CUDA_FLAGS=$2" &&
    cmake --build "$1" -j 4 --target flash_attn_mma; } > "$L/build_$(basename $1).log" 2>&1
}
flag_build build-gpu-b "-DATTNLAB_TWO_PASS_HALVES_ALWAYS=0" & pb=$!
flag_build build-gpu-c "-DATTNLAB_TWO_PASS_POLY_EXP_EVERY=0" & pc=$!
probe_build_with_head flash_attn_mma test_gpu_variants test_device_math
wait $pb && FB=build-gpu-b/flash_attn_mma || { tail -20 $L/build_build-gpu-b.log; FB=; }
wait $pc && FC=build-gpu-c/flash_attn_mma || { tail -20 $L/build_build-gpu-c.log; FC=; }
el "builds: F=$F FB=$FB FC=$FC FO=$FO"
run_test 60 test_device_math
cat $L/test_device_math.log | head -3
run_test 480 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
p1() {  # p1 LABEL BINARY [ENV=VALUE] : ncu of pass 1 at D = 1024
  local label=$1 bin=$2; shift 2
  [ -z "$bin" ] && return
  echo "$label pass 1: $(env "$@" timeout 90 ncu --clock-control none --metrics ${MM:-$M} -k regex:"two_pass_scores" -c 1 $bin \
    --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__|smsp__|l1tex__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
}
for i in 1 2; do
  p1 new $F X=0
  p1 new-no-early $F ATTNLAB_TWO_PASS_NO_EARLY_MMA=1
  p1 n256 "$FB" X=0
  p1 n256-no-early "$FB" ATTNLAB_TWO_PASS_NO_EARLY_MMA=1
  p1 no-poly "$FC" X=0
  p1 head "$FO" X=0
done
el ncu
MM=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
p1 pipes-new $F X=0
p1 pipes-no-poly "$FC" X=0
p1 pipes-head "$FO" X=0
el "ncu pipes"
row() { timeout 60 env "${@:3}" $2 $SHAPE --variant "$1" --iters 20 2>&1 | grep -E "^ *two-pass" | cut -c1-110; }
ab() {
  SHAPE="$*"
  echo "== $*"
  echo "new:           $(row 'two-pass*' $F X=0)"
  echo "new-no-early:  $(row 'two-pass+stage4' $F ATTNLAB_TWO_PASS_NO_EARLY_MMA=1)"
  [ -n "$FB" ] && echo "n256 (stage4): $(row 'two-pass+stage4' $FB X=0)"
  [ -n "$FC" ] && echo "no-poly:       $(row 'two-pass+stage4' $FC X=0)"
  [ -n "$FO" ] && echo "head:          $(row 'two-pass*' $FO X=0)"
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 512
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 256
ab --B 1 --H 8 --N 8192 --D 1024
el ab
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers two-pass+stage4 "--Nq 256 --Nk 300 --D 256 --causal" "--Nq 70 --Nk 130 --D 1024 --causal --dtype bf16"
SAN_TOOLS='memcheck racecheck' variant_sanitizers two-pass+stage2 "--Nq 256 --Nk 300 --D 128 --causal"
el done
