#!/usr/bin/env bash
# One-off probe (removed in the next commit): rung 12's lazy rescale and D = 64
# tiles, A/B in alternation, and their correctness. Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}
mkdir -p "$out"
b=build-gpu
log=$out/probe.txt
{ cmake -S . -B $b -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=ON -DATTNLAB_PTXAS_VERBOSE=ON -G Ninja &&
  cmake --build $b -j 16; } > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build done at $SECONDS s; spills: $(grep -c 'Registers are spilled' "$out/build.log")" | tee "$log"
h=$b/flash_attn_mma
# correctness first (rung 12 only), in parallel: the GPU variant tests under each tile, the sanitizers
test() { ATTNLAB_WS_TILES=$1 timeout 240 $b/test_gpu_variants 'ws*' > "$out/test_ws_$1.log" 2>&1
         echo "test_gpu_variants ws* ATTNLAB_WS_TILES=$1: rc=$? $(tail -1 "$out/test_ws_$1.log")" > "$out/t_$1.txt"; }
san() { local n=$1 tool=$2 tiles=$3; shift 3
        ATTNLAB_WS_TILES=$tiles timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $h --B 1 --H 2 "$@" --variant 'ws*' \
          --check --no-peers --iters 1 --warmup 0 > "$out/san$n.tmp" 2>&1
        echo "$tool tiles=$tiles $*: rc=$? $(grep -E 'SUMMARY' "$out/san$n.tmp" | tail -1) $(grep -c PASS "$out/san$n.tmp") PASS $(grep -c FAIL "$out/san$n.tmp") FAIL" > "$out/s_$n.txt"; }
pids=()
for tiles in "" no-mask two-warpgroups causal; do test "$tiles" & pids+=($!); done
n=0
for tool in memcheck racecheck synccheck; do
  san $((n++)) $tool no-mask --Nq 129 --Nk 300 --D 64 & pids+=($!)
  san $((n++)) $tool "" --Nq 129 --Nk 300 --D 64 & pids+=($!)
  san $((n++)) $tool no-mask --Nq 1 --Nk 17 --D 64 --dtype bf16 & pids+=($!)
  san $((n++)) $tool "" --Nq 300 --Nk 77 --D 128 --causal & pids+=($!)
done
wait "${pids[@]}"
cat "$out"/t_*.txt "$out"/s_*.txt | tee -a "$log"; rm -f "$out"/t_*.txt "$out"/s_*.txt "$out"/san*.tmp
echo "tests done at $SECONDS s" | tee -a "$log"
# timing: A/B in alternation, two rounds; TFLOPS of ws+stage2+pingpong (and the peers on the default run)
row() { grep -E "^ *$1:" | sed -E 's/.*TFLOPS:([0-9.]+).*/\1/' | head -1; }
run() {  # LABEL ENV ARGS...
  local label=$1 env=$2; shift 2
  env $env $h "$@" --variant 'ws+stage2+pingpong' --no-check --iters 30 --warmup 5 > "$out/run.tmp" 2>&1
  printf '%-44s %-34s ws+pp %7s  cudnn %7s  fa2 %7s\n' "$*" "$label" "$(row 'ws\+stage2\+pingpong' < "$out/run.tmp")" \
    "$(row 'sdpa\(cudnn\)' < "$out/run.tmp")" "$(row 'sdpa\(flash\)' < "$out/run.tmp")" | tee -a "$log"
}
for round in 1 2; do
  for shape in "--B 1 --H 8 --N 8192 --D 64" "--B 16 --H 16 --N 4096 --D 64" "--B 1 --H 8 --N 8192 --D 64 --causal" \
               "--B 1 --H 8 --N 8192 --D 128" "--B 1 --H 8 --N 8192 --D 128 --causal" "--B 1 --H 8 --N 8192 --D 256" \
               "--B 1 --H 8 --N 8192 --D 256 --causal" "--B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16"; do
    run default "X=1" $shape --sdpa
    run eager "ATTNLAB_WS_EAGER_RESCALE=1" $shape --no-peers
    if [[ "$shape" == *"--D 64" ]]; then
      run no-mask-tiles "ATTNLAB_WS_TILES=no-mask" $shape --no-peers
      run causal-tiles "ATTNLAB_WS_TILES=causal" $shape --no-peers
    fi
  done
  echo "round $round done at $SECONDS s" | tee -a "$log"
done
# ncu at D = 64: the three tiles, one launch each
if command -v ncu > /dev/null; then
  for tiles in no-mask two-warpgroups causal; do
    ATTNLAB_WS_TILES=$tiles timeout 60 ncu --clock-control none -k regex:ws_kernel -c 1 \
      --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
      $h --B 1 --H 8 --N 8192 --D 64 --variant 'ws+stage2+pingpong' --no-check --no-peers --iters 1 --warmup 0 > "$out/ncu.tmp" 2>&1
    echo "ncu $tiles:" | tee -a "$log"; grep -E "gpu__time|hmma|pipe_xu|inst_executed.sum" "$out/ncu.tmp" | tee -a "$log"
  done
fi
rm -f "$out/run.tmp" "$out/ncu.tmp"
echo "all done at $SECONDS s" | tee -a "$log"
