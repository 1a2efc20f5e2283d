#!/usr/bin/env bash
# One-off probe (removed in the next commit): rung 12's causal tiles on a
# persistent grid from an atomic counter, against one block per tile
# (ATTNLAB_NO_DYNAMIC=1), after rung 12's tests and sanitizers.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}
mkdir -p "$out"
b=build-gpu
SECONDS=0
{ cmake -S . -B $b -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_BUILD_TESTS=ON &&
  cmake --build $b -j 16 --target flash_attn_mma test_gpu_variants; } > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built at $SECONDS s; spill warnings: $(grep -c 'Registers are spilled' "$out/build.log")"
timeout 240 $b/test_gpu_variants 'ws*' > "$out/tests.txt" 2>&1 &
tp=$!
san() {
  for args in "--H 4 --Hkv 2 --Nq 130 --Nk 300 --D 128 --causal" "--Nq 129 --Nk 77 --D 64 --causal" \
              "--H 4 --Hkv 1 --Nq 300 --Nk 130 --D 192 --Dv 128 --causal" "--H 8 --Nq 1000 --Nk 1000 --D 256 --causal --dtype bf16"; do
    for tool in memcheck racecheck synccheck; do
      timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $b/flash_attn_mma --B 1 $([[ $args == *--H* ]] || echo --H 2) $args \
        --variant 'ws*' --show-all --check --no-peers --iters 1 --warmup 0 > "$out/san_run.log" 2>&1
      echo "$tool $args: rc=$? $(grep -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' "$out/san_run.log" | tail -1) $(grep -c PASS "$out/san_run.log") PASS"
    done
  done
}
san > "$out/sanitizer.txt" 2>&1
wait $tp
echo "tests rc=$? at $SECONDS s: $(tail -1 "$out/tests.txt")"; grep -i "FAIL" "$out/tests.txt" | head -5
cat "$out/sanitizer.txt"
ab() {
  for mode in dynamic blocks dynamic blocks; do
    [ "$mode" = blocks ] && export ATTNLAB_NO_DYNAMIC=1 || unset ATTNLAB_NO_DYNAMIC
    timeout 90 $b/flash_attn_mma "$@" --variant 'ws*' --sdpa --show-all --iters 20 --warmup 3 > "$out/ab_run.log" 2>&1
    echo "== $mode $*  (rc=$?)"
    grep -E "ws\+|sdpa\(cudnn\)|FAIL" "$out/ab_run.log" | sed 's/\[.*\], //' | cut -c1-110
  done
  unset ATTNLAB_NO_DYNAMIC
}
{
  ab --B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal
  ab --B 1 --H 8 --N 8192 --D 128 --causal
  ab --B 1 --H 8 --N 8192 --D 64 --causal
  ab --B 1 --H 8 --N 8192 --D 256 --causal
  ab --B 1 --H 32 --Hkv 8 --N 8192 --D 128 --causal
  ab --B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16 --causal
} > "$out/ab.txt" 2>&1
echo "done at $SECONDS s"
cat "$out/ab.txt"
