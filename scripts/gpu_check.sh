#!/usr/bin/env bash
# The one command for the GPU machine: configure, build, run the GPU tests,
# sanitize, and run the standard benchmark set. Logs, a summary and the CSV go
# to $OUT when it is set (the device tool's output folder), else results/<gpu>/.
#
#   scripts/gpu_check.sh            # everything
#   QUICK=1 scripts/gpu_check.sh    # skip the sanitizer and the causal benchmarks
# Switches (environment): SANITIZER=0, NCU=0, SKIP_BENCH=1 (issue 4's and issue 5's benchmarks), SKIP_TESTS=1,
# SKIP_TORCH_REF=1, DMATTN=0 (skip issue 5's tests and benchmarks; DMATTN_L="1024 8192"), ONLY='wgmma*' (GPU variant tests of matching variants only), SWEEP=1 (SWEEP_ARGS="--iters 5", SWEEP_TIMEOUT=400 seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${BUILD_DIR:-build-gpu}
arch=${CUDA_ARCH:-90a}
export ATTNLAB_COMMIT=${ATTNLAB_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}

slug=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^NVIDIA //; s/[^A-Za-z0-9.]\+/-/g; s/-$//')
out=${OUT:-results/${slug:-unknown-gpu}}
mkdir -p "$out"
summary="$out/summary.md"
csv="$out/bench.csv"
rm -f "$csv"

step() { printf '\n=== [%d s] %s\n' "$SECONDS" "$*"; }
# Read now, not in the summary: the whole run is close to one 10-minute device
# call (session 13's was cut there, at this line).
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)

step "configure + build (sm_$arch)"
# With PyTorch when the python3 on PATH has it; without, if its CMake config fails.
{ cmake -S . -B "$build" -DCMAKE_CUDA_ARCHITECTURES="$arch" -DATTNLAB_PTXAS_VERBOSE=ON ||
  { echo "configure with torch failed; retrying without"; rm -rf "$build";
    cmake -S . -B "$build" -DCMAKE_CUDA_ARCHITECTURES="$arch" -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_WITH_TORCH=OFF; } &&
  cmake --build "$build" -j "$(nproc)"; } > "$out/build.log" 2>&1
build_rc=$?
grep -E "attnlab:|error|spill|lmem|retrying" "$out/build.log" | grep -v "0 bytes spill" | head -20
[ $build_rc -eq 0 ] || { echo "build failed (see build.log)"; tail -30 "$out/build.log"; exit 1; }
grep -A2 "split_q_kernel" "$out/build.log" | grep -E "registers|Compiling" | sed 's/_ZN7attnlab[^ ]*SplitQConfigIL//' > "$out/ptxas_split_q.txt"

# The sanitizers and the tests check correctness only, so they share the GPU:
# the sanitizers run in the background while the tests run, and the
# benchmarks run after both, alone. (Session 13: the whole run in sequence
# took ~550 s, at the edge of one 10-minute device call; session 15's took
# ~590 s with the sanitizers in one stream.)
# sanitize LOG TOOL "SHAPE" [FLAGS...] : one checked run of the harness under
# compute-sanitizer (its output in LOG), a line with its exit status and the
# tool's summary (and a warning where a dynamic-mask run's mask left no tile
# to compute).
sanitize() {
  local log=$1 tool=$2 shape=$3 rc
  shift 3
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$build/flash_attn_mma" --B 1 --H 2 $shape \
    --iters 1 --warmup 0 --check "$@" > "$log" 2>&1
  rc=$?
  echo "$tool $shape: rc=$rc $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1)$(
    grep -q 'tiles skipped 100.0%' "$log" && echo ' (EMPTY MASK: only the fully-masked path ran)')"
}
# The shapes: the rungs (every variant: --show-all), then dynamic-mask
# attention — forward with a forced split count, and the backward. The top-W
# masks are block-smoothed by majority (--block 64) unless --block 0: W must
# be about Nk/2 for some key blocks to survive (session 14 found seven of
# these eight shapes with W <= Nk/10, so an all-zero mask: they exercised
# only the fully-masked path). A run whose mask is empty says so.
rung_shapes=("--Nq 129 --Nk 77 --D 64 --causal" "--Nq 17 --Nk 200 --D 256 --dtype bf16" "--Nq 70 --Nk 130 --D 512 --causal"
             "--Nq 70 --Nk 130 --D 1024 --causal" "--Nq 256 --Nk 300 --D 256 --causal --variant two-pass+stage4")
dmattn_shapes=("--Nq 1 --Nk 3000 --D 128 --Hkv 1 --mask topk --window 64 --block 0 --bias --splits 4"
               "--Nq 1 --Nk 20000 --D 256 --mask topk --window 3000 --block 0 --bias --softcap 20 --splits 1"
               "--Nq 70 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 64 --bias --bwd"
               "--B 2 --Nq 130 --Nk 77 --D 128 --mask topk --window 16 --block 0 --bias --deterministic"
               "--Nq 130 --Nk 300 --D 128 --causal --mask topk --window 150 --bias"
               "--Nq 130 --Nk 301 --D 64 --mask topk --window 64 --block 0 --bias --dma-core wgmma-cp.async"
               "--Nq 200 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 64 --bias --bwd-chunks 3"
               "--Nq 200 --Nk 1000 --D 128 --Hkv 1 --causal --mask topk --window 500 --bias --dma-mask-scan in-kernel"
               "--Nq 130 --Nk 2333 --D 64 --mask topk --window 1166 --bias --dma-mask-scan prepass"
               "--Nq 600 --Nk 800 --D 64 --Hkv 1 --causal --mask topk --window 400 --bias --dma-mask-scan pipelined --dma-prepass-chunks 5 --mask-bits"
               "--Nq 130 --Nk 300 --D 128 --causal --mask topk --window 150 --bias --bwd --mask-bits")
# run_sanitizers TOOL STREAM FIRST COUNT : shapes FIRST .. FIRST+COUNT-1 of the
# rung shapes followed by the dynamic-mask ones, under TOOL, into
# sanitizer_STREAM.txt. Three streams run at once (memcheck; racecheck in two
# halves): in one stream the 28 runs took ~280 s, the run's longest phase.
run_sanitizers() {
  local tool=$1 stream=$2 first=$3 count=$4 i
  for ((i = first; i < first + count; ++i)); do
    if ((i < ${#rung_shapes[@]})); then sanitize "$out/sanitizer_$stream.log" $tool "${rung_shapes[i]}" --show-all
    else sanitize "$out/sanitizer_$stream.log" $tool "${dmattn_shapes[i - ${#rung_shapes[@]}]}"; fi
  done > "$out/sanitizer_$stream.txt" 2>&1
}
san_pids=()
if [ -z "${QUICK:-}" ] && [ "${SANITIZER:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer (memcheck, racecheck) on ragged shapes: started in the background"
  n_shapes=$(( ${#rung_shapes[@]} + ${#dmattn_shapes[@]} ))
  run_sanitizers memcheck memcheck 0 $n_shapes & san_pids+=($!)
  run_sanitizers racecheck racecheck1 0 $(( n_shapes / 2 )) & san_pids+=($!)
  run_sanitizers racecheck racecheck2 $(( n_shapes / 2 )) $(( n_shapes - n_shapes / 2 )) & san_pids+=($!)
fi

step "tests (cpu + gpu)"
if [ -n "${SKIP_TESTS:-}" ]; then echo "skipped (SKIP_TESTS)" > "$out/tests.log"; echo "skipped" > "$out/gpu_variants.log"; else
# ctest leaves out test_gpu_variants and the dynamic-mask tests: they run
# with their own logs, test_gpu_variants in the background beside ctest and
# the dynamic-mask tests below. All check correctness only, on small shapes
# (session 15: in sequence the tests took ~300 s and the whole run no longer
# fitted one 10-minute call).
{ timeout 300 "$build/test_gpu_variants" "${ONLY:-*}" > "$out/gpu_variants.log" 2>&1 ||
  echo "test_gpu_variants: exit $? (124 = timed out)" >> "$out/gpu_variants.log"; } &
variants_pid=$!
timeout 300 ctest --test-dir "$build" -E "gpu_variants|gpu_dmattn" --output-on-failure 2>&1 | tee "$out/tests.log" | tail -8
fi

if [ "${DMATTN:-1}" != 0 ]; then
  step "dynamic-mask attention (issue 5): tests"
  # dm_test TEST SECONDS LOG: one test under a timeout; its status line in LOG.rc.
  # The three shorter tests run beside test_dmattn (their CPU references use
  # other cores; session 19 doubled test_dmattn with the bit-packed mask runs).
  dm_test() { timeout "$2" "$build/$1" > "$out/$3" 2>&1; echo "$1: rc=$? $(tail -1 "$out/$3")" > "$out/$3.rc"; }
  dm_test test_dmattn_reference 240 dmattn_reference_tests.log & dm_pids=($!)
  dm_test test_dmattn_summary 150 dmattn_summary_tests.log & dm_pids+=($!)
  dm_test test_dmattn_backward_reference 150 dmattn_backward_reference_tests.log & dm_pids+=($!)
  dm_test test_dmattn 400 dmattn_tests.log
  dm_test test_dmattn_backward 240 dmattn_backward_tests.log
  wait "${dm_pids[@]}"
  for t in dmattn_reference dmattn dmattn_summary dmattn_backward_reference dmattn_backward; do
    cat "$out/${t}_tests.log.rc"
    rm -f "$out/${t}_tests.log.rc"
  done
  grep -m 20 FAIL "$out/dmattn_tests.log" "$out/dmattn_summary_tests.log" "$out/dmattn_reference_tests.log" \
    "$out/dmattn_backward_reference_tests.log" \
    "$out/dmattn_backward_tests.log" | cut -c1-220
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  wait "$variants_pid"
  echo "gpu variants: $(tail -1 "$out/gpu_variants.log")"
fi
if [ ${#san_pids[@]} -gt 0 ]; then
  wait "${san_pids[@]}"
  cat "$out"/sanitizer_{memcheck,racecheck1,racecheck2}.txt > "$out/sanitizer_summary.txt"
  rm -f "$out"/sanitizer_{memcheck,racecheck1,racecheck2}.txt
  step "compute-sanitizer results"
  cat "$out/sanitizer_summary.txt"
fi

if [ "${NCU:-1}" != 0 ] && command -v ncu >/dev/null; then
  step "ncu: shared-memory bank conflicts, padded vs swizzled (split-q, D=64 and 128)"
  { scripts/ncu_bank_conflicts.sh "$build/flash_attn_mma" 64; scripts/ncu_bank_conflicts.sh "$build/flash_attn_mma" 128; } \
    2>&1 | tee "$out/ncu_bank_conflicts.txt"
fi

step "SASS: tensor-core instructions per rung (HGMMA = wgmma, HMMA = mma.sync)"
for obj in $(find "$build" -name '[01][0-9]_*.cu.o' | sort); do
  printf '%-24s HGMMA %5s  HMMA %5s\n' "$(basename "$obj" .cu.o)" \
    "$(cuobjdump -sass "$obj" 2>/dev/null | grep -c HGMMA)" "$(cuobjdump -sass "$obj" 2>/dev/null | grep -c ' HMMA')"
done 2>&1 | tee "$out/sass_mma.txt"

step "benchmarks"
: > "$out/bench.txt"
peers=(--torch)
"$build/flash_attn_mma" --list --sdpa >/dev/null 2>&1 && peers+=(--sdpa)
bench() {
  timeout 180 "$build/flash_attn_mma" "$@" "${peers[@]}" --check --show-all --iters 20 --warmup 3 --csv "$csv" 2>&1 | tee -a "$out/bench.txt"
}
# Large shapes: timed only (the fp32 reference alone would take minutes).
bench_timing_only() {
  timeout 180 "$build/flash_attn_mma" "$@" "${peers[@]}" --show-all --iters 5 --warmup 1 --csv "$csv" 2>&1 | tee -a "$out/bench.txt"
}
[ -n "${SKIP_BENCH:-}" ] && echo "skipped (SKIP_BENCH)"
for D in $([ -n "${SKIP_BENCH:-}" ] || echo 64 128 256); do
  bench --B 1 --H 8 --N 8192 --D $D
  [ -n "${QUICK:-}" ] || bench --B 1 --H 8 --N 8192 --D $D --causal
done
if [ -z "${QUICK:-}" ] && [ -z "${SKIP_BENCH:-}" ]; then
  bench --B 1 --H 8 --N 8192 --D 64 --dtype bf16
  bench --B 1 --H 8 --N 8192 --D 512
  bench --B 1 --H 8 --N 8192 --D 1024
  bench --B 1 --H 8 --N 8192 --D 1024 --causal
  # The ceiling issue 4's D = 1024 target meets: cuBLAS's two GEMMs alone,
  # against torch's unfused path, on the card as it is now (docs/11_two_pass.md).
  python3 -c "import torch" 2>/dev/null && timeout 120 python3 scripts/gemm_ceiling.py --D 1024 512 2>&1 | tee "$out/gemm_ceiling.txt"
  bench --B 4 --H 16 --N 4096 --D 128
  bench --B 1 --H 8 --Nq 1000 --Nk 8192 --D 128 --causal

  bench_timing_only --B 1 --H 48 --N 16384 --D 512
fi

if [ -z "${SKIP_TORCH_REF:-}" ] && [[ " ${peers[*]} " == *" --sdpa "* ]]; then
  step "checks against torch's fp32 math SDPA (--reference torch)"
  for shape in "--N 1000 --D 64 --causal" "--Nq 1000 --Nk 4096 --D 128 --causal" "--Nq 129 --Nk 17 --D 256 --dtype bf16" "--N 127 --D 512"; do
    timeout 60 "$build/flash_attn_mma" --B 1 --H 8 $shape --check --reference torch --iters 3 --warmup 1 --show-all 2>&1 |
      tee -a "$out/reference_torch.txt" | tail -3
  done
fi

if [ "${DMATTN:-1}" != 0 ] && [ -z "${SKIP_BENCH:-}" ]; then
  step "dynamic-mask attention (issue 5): benchmarks"
  : > "$out/dmattn_bench.txt"
  dbench() { timeout 180 "$build/flash_attn_mma" "$@" "${peers[@]}" --iters 10 --warmup 2 --csv "$out/dmattn.csv" 2>&1 | tee -a "$out/dmattn_bench.txt" | grep -vE "^-+$"; }
  # flash-dmattn's training shape: B=1 H=2 Hkv=1 D=128 causal, top-1024 keys of the bias per query
  # (--mask-bits: also the rows on the same mask bit-packed, checked bitwise against the byte mask's)
  for L in ${DMATTN_L:-1024 8192 16384 32768}; do
    dbench --B 1 --H 2 --Hkv 1 --N $L --D 128 --causal --mask topk --window 1024 --bias --mask-bits $([ $L -le 8192 ] && echo --check)
  done
  # the forward's mask scans where the automatic choice changes (in-kernel up to 16K keys per
  # block, then the pipelined pre-pass)
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan prepass
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan pipelined
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan in-kernel
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan prepass
  # decoding (Nq = 1): split-KV with the automatic split count, and forced counts. Plain
  # top-W (--block 0): with a random bias, 64-key majority smoothing would keep almost nothing.
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 32768 --D 128 --causal --mask topk --window 1024 --block 0 --bias --check
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 32768 --D 128 --causal --mask topk --window 1024 --block 0 --bias --check --splits 1
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --causal --mask topk --window 1024 --block 0 --bias
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias --mask-bits
  # decoding: the key-gather core (automatic) against the tile kernel, sparse and dense
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias --dma-core wgmma
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias --dma-core wgmma
  # backward: checked where the reference is quick
  dbench --B 1 --H 2 --Hkv 1 --N 2048 --D 128 --causal --mask topk --window 512 --bias --bwd --check --mask-bits
  dbench --B 2 --H 4 --Hkv 2 --N 2048 --D 128 --causal --mask topk --window 512 --bias --deterministic --check --mask-bits
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --deterministic
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --bwd --mask-bits
  # the same with its own mask pre-pass (the in-kernel forward leaves no summary to reuse)
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --bwd --dma-mask-scan in-kernel
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --bwd --check
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --bwd-chunks 1
  dbench --B 1 --H 8 --N 1024 --D 128 --mask ones --bias --bwd --check
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --bwd --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --bwd --dma-core mma
  # the skipping machinery on an all-ones mask with a bias, against the dense split-q rung
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --check --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-core mma
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --dma-core mma
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --bwd --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-mask-scan in-kernel
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-mask-scan pipelined
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --dma-mask-scan pipelined
fi

if [ -n "${SWEEP:-}" ]; then
  step "sweep"
  SWEEP_OUT="$out" NO_PLOTS=1 BUILD_DIR="$build" timeout "${SWEEP_TIMEOUT:-400}" scripts/sweep ${SWEEP_ARGS:-} 2>&1 | tee "$out/sweep.txt" | grep -E "^\[|sweep" | tail -80
fi

step "summary -> $summary"
TORCH_VERSION="$torch_version" CUDA_ARCH="$arch" ONLY="${ONLY:-}" scripts/gpu_summary.sh "$out" > "$summary"
cat "$summary"
ok=0
grep -q " 0 failed" <<<"$(tail -1 "$out/gpu_variants.log")" && grep -q "100% tests passed" "$out/tests.log" || ok=1
# Everything but the headline files goes into one archive (the device returns 8 files).
headline='^(summary.md|bench.csv|bench.txt|fwd.csv|sweep.txt|ncu_bank_conflicts.txt|reference_torch.txt|gemm_ceiling.txt|dmattn.csv|dmattn_bench.txt|logs.tar.gz)$'
archived=$(cd "$out" && ls | grep -vE "$headline")
tar -czf "$out/logs.tar.gz" -C "$out" $archived 2>/dev/null && (cd "$out" && rm -f $archived)
exit $ok
