#!/usr/bin/env bash
# probe (removed in the next commit): rung 15 `bwd-roles` on the H200 — build,
# timings at D = 256 beside the torch peers, the backward variant tests, the
# sanitizers on a ragged D = 256 shape, and rung 14 at D = 128 (its dQ staging
# moved into a shared helper). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}
mkdir -p "$out"
b=build-gpu
SECONDS=0
build() {
  { cmake -S . -B $b -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_BUILD_TESTS=ON &&
    cmake --build $b -j16 --target flash_attn_mma test_gpu_bwd_variants; } > "$out/build$1.log" 2>&1 ||
    { tail -40 "$out/build$1.log"; exit 1; }
  echo "build$1 ${SECONDS}s; spills: $(grep -c 'Registers are spilled' "$out/build$1.log")"
}
build ""
bench() {
  timeout 150 $b/flash_attn_mma --bwd "$@" --check --show-all --iters 20 --warmup 3 --csv "$out/bwd.csv" \
    >> "$out/bench.txt" 2>&1 || echo "bench exit $? at $*"
}
bench --B 1 --H 8 --N 8192 --D 256
bench --B 1 --H 8 --N 8192 --D 256 --causal
bench --B 1 --H 8 --N 8192 --D 128 --variant 'bwd-ws*'
echo "bench ${SECONDS}s"
grep -E "cudnn|flash\)|bwd-roles" "$out/bench.txt" | cut -c1-150
for v in 'bwd-roles*' 'bwd-ws*'; do
  timeout 200 $b/test_gpu_bwd_variants "$v" > "$out/test_${v%\*}.log" 2>&1
  echo "test $v: rc=$? $(tail -1 "$out/test_${v%\*}.log") ${SECONDS}s"; grep -m5 FAIL "$out/test_${v%\*}.log"
done
for tool in memcheck racecheck synccheck; do
  for shape in "--H 4 --Hkv 2 --Nq 150 --Nk 221 --D 256 --causal --variant bwd-roles*" \
               "--H 4 --Hkv 1 --Nq 383 --Nk 257 --D 128 --dtype bf16 --variant bwd-ws*"; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $b/flash_attn_mma --bwd $shape \
      --iters 1 --warmup 0 --check --no-peers > "$out/san.log" 2>&1
    echo "$tool $shape: rc=$? $(grep -E 'SUMMARY' "$out/san.log" | tail -1)"
  done
done
echo "done ${SECONDS}s"
