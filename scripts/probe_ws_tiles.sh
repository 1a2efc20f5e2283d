#!/usr/bin/env bash
# One-off: rung 12's tiles (default against +fa3tile), the causal tile order
# (ATTNLAB_NO_LPT=1 against the default), D != Dv, beside SDPA in the same process;
# the variant tests and compute-sanitizer of ws* on ragged shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"
SECONDS=0
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=ON > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j 16 >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built at $SECONDS s"
b=build-gpu/flash_attn_mma
# sanitizers in the background
san() { local tool=$1; for shape in "--Nq 129 --Nk 77 --D 64 --causal" "--Nq 17 --Nk 200 --D 256 --dtype bf16" \
               "--Nq 70 --Nk 130 --D 192 --Dv 128 --causal" "--Nq 200 --Nk 70 --D 128 --Dv 64 --causal --dtype bf16"; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $b --B 1 --H 2 $shape --variant 'ws*' --check --iters 1 --warmup 0 --show-all > /tmp/san_$tool.log 2>&1
    echo "$tool $shape: rc=$? $(grep -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' /tmp/san_$tool.log | tail -1) $(grep -c PASS /tmp/san_$tool.log) PASS"
  done > "$out/sanitizer_$tool.txt" 2>&1; }
( timeout 240 build-gpu/test_gpu_variants 'ws*' > "$out/test_ws.log" 2>&1; echo "test rc=$?" >> "$out/test_ws.log" ) &
bg="$! "
for tool in memcheck racecheck synccheck; do san $tool & bg+="$! "; done
bg=$!
{
for D in 64 128 256; do for c in "" "--causal"; do
  $b --B 1 --H 8 --N 8192 --D $D $c --variant 'ws*' --sdpa --torch --check --show-all --iters 20 --warmup 3
  [ -n "$c" ] && ATTNLAB_NO_LPT=1 $b --B 1 --H 8 --N 8192 --D $D $c --variant 'ws*' --sdpa --show-all --iters 20 --warmup 3
done; done
$b --B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal --variant 'ws*' --sdpa --check --show-all --iters 20 --warmup 3
ATTNLAB_NO_LPT=1 $b --B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal --variant 'ws*' --sdpa --show-all --iters 20 --warmup 3
for c in "" "--causal"; do
  $b --B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16 $c --sdpa --torch --check --show-all --iters 20 --warmup 3
  $b --B 1 --H 8 --N 8192 --D 128 --Dv 64 $c --variant 'ws*' --sdpa --check --show-all --iters 20 --warmup 3
done
$b --B 2 --H 3 --Nq 1000 --Nk 17 --D 192 --Dv 128 --check --show-all --iters 2 --warmup 1
$b --B 2 --H 3 --Nq 17 --Nk 1000 --D 128 --Dv 64 --causal --dtype bf16 --check --show-all --iters 2 --warmup 1
} > "$out/bench.txt" 2>&1
echo "bench done at $SECONDS s"
wait $bg
cat "$out"/sanitizer_*.txt > "$out/sanitizer.txt"
echo "all done at $SECONDS s"
tail -3 "$out/test_ws.log"; cat "$out/sanitizer.txt"
grep -E "^ *(ws|sdpa|unfused|torch)[^:]*:|^---" "$out/bench.txt" | sed 's/\[.*\], //' | cut -c1-170
