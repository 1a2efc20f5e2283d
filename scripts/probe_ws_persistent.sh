#!/usr/bin/env bash
# One-off: rung 12 with one block per work item against +persistent (one block per
# SM), beside SDPA in the same process, at the forward engine's shapes (GQA included);
# the ws* variant tests and compute-sanitizer of +persistent on ragged shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"
SECONDS=0
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=ON > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j 16 >> "$out/build.log" 2>&1 ||
  { echo "BUILD WITH TORCH FAILED"; grep -E "error" "$out/build.log" | head -20; rm -rf build-gpu;
    cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=ON -DATTNLAB_WITH_TORCH=OFF >> "$out/build.log" 2>&1 &&
    cmake --build build-gpu -j 16 >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }; }
echo "built at $SECONDS s"
b=build-gpu/flash_attn_mma
peers=$($b --list --sdpa >/dev/null 2>&1 && echo --sdpa)
san() { local tool=$1; for shape in "--Nq 129 --Nk 77 --D 64 --causal" "--B 2 --H 4 --Hkv 2 --Nq 300 --Nk 1000 --D 128 --causal" \
               "--H 4 --Hkv 1 --Nq 700 --Nk 130 --D 192 --Dv 128 --causal" "--B 3 --H 3 --Nq 1000 --Nk 600 --D 256 --dtype bf16"; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $b --B 1 --H 2 $shape --variant 'ws*' --check --iters 1 --warmup 0 --show-all > /tmp/san_$tool.log 2>&1
    echo "$tool $shape: rc=$? $(grep -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' /tmp/san_$tool.log | tail -1) $(grep -c PASS /tmp/san_$tool.log) PASS"
  done > "$out/sanitizer_$tool.txt" 2>&1; }
( timeout 240 build-gpu/test_gpu_variants 'ws*' > "$out/test_ws.log" 2>&1; echo "test rc=$?" >> "$out/test_ws.log" ) &
bg="$! "
for tool in memcheck racecheck synccheck; do san $tool & bg+="$! "; done
wait $bg
cat "$out"/sanitizer_*.txt > "$out/sanitizer.txt"; rm -f "$out"/sanitizer_*.txt
echo "tests done at $SECONDS s"
run() { $b "$@" --variant 'ws*' $peers --check --show-all --iters 30 --warmup 5; }
{
for D in 64 128 256; do run --B 1 --H 8 --N 8192 --D $D; run --B 1 --H 8 --N 8192 --D $D --causal; done
run --B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal
run --B 1 --H 32 --Hkv 8 --N 8192 --D 128
run --B 1 --H 32 --Hkv 8 --N 8192 --D 128 --causal
run --B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16
run --B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16 --causal
run --B 1 --H 8 --N 8192 --D 64 --dtype bf16
run --B 4 --H 16 --N 4096 --D 128
run --B 1 --H 8 --Nq 1000 --Nk 8192 --D 128 --causal
} > "$out/bench.txt" 2>&1
# ncu, one launch each: the tensor pipe's active share and the issue rate, beside cuDNN
m='gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_issue_stalled_barrier_per_issue_active.ratio,smsp__warps_issue_stalled_long_scoreboard_per_issue_active.ratio'
for D in 64 128 256; do
  timeout 120 ncu --clock-control none --metrics "$m" -k 'regex:ws_kernel|cudnn' -c 6 \
    $b --B 1 --H 8 --N 8192 --D $D --variant 'ws+stage2+pingpong*' $peers --iters 1 --warmup 0 > "$out/ncu_d$D.txt" 2>&1
  echo "== ncu D=$D rc=$?"; grep -E '^  [a-zA-Z_]|gpu__time|tensor_op|issue_active|stalled' "$out/ncu_d$D.txt" | sed 's/  */ /g' | cut -c1-140
done > "$out/ncu.txt" 2>&1
rm -f "$out"/ncu_d*.txt
echo "all done at $SECONDS s"
cat "$out/ncu.txt"
tail -2 "$out/test_ws.log"; cat "$out/sanitizer.txt"
grep -E "^ *(ws|sdpa\(cudnn)[^:]*:|^---" "$out/bench.txt" | sed 's/\[.*\], //; s/time:[0-9.]*ms, //; s/PASS err.*/PASS/' | cut -c1-120
