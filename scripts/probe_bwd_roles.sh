#!/usr/bin/env bash
# probe (removed in the next commit): rung 15 `bwd-roles` on the H200 — build,
# timings at D = 256 (and rung 14 at D = 128 after the shared host code moved)
# beside the torch peers, the backward variant tests, and the sanitizers on a
# ragged D = 256 shape. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}
mkdir -p "$out"
b=build-gpu
SECONDS=0
{ cmake -S . -B $b -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_BUILD_TESTS=ON &&
  cmake --build $b -j16 --target flash_attn_mma test_gpu_bwd_variants; } > "$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
echo "build ${SECONDS}s; spills: $(grep -c 'Registers are spilled' "$out/build.log")"
bench() {
  timeout 150 $b/flash_attn_mma --bwd "$@" --check --show-all --iters 20 --warmup 3 --csv "$out/bwd.csv" \
    >> "$out/bench.txt" 2>&1 || echo "bench exit $? at $*"
}
bench --B 1 --H 8 --N 8192 --D 256
bench --B 1 --H 8 --N 8192 --D 256 --causal
bench --B 1 --H 8 --N 8192 --D 128
echo "bench ${SECONDS}s"
grep -E "bwd|PASS|FAIL" "$out/bench.txt" | grep -vE "^\s*$" | cut -c1-150 | tail -40
timeout 200 $b/test_gpu_bwd_variants 'bwd-roles*' > "$out/test_roles.log" 2>&1
echo "test bwd-roles*: rc=$? $(tail -1 "$out/test_roles.log")"; grep -m5 FAIL "$out/test_roles.log"
echo "tests ${SECONDS}s"
for tool in memcheck racecheck synccheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $b/flash_attn_mma --bwd --H 4 --Hkv 2 --Nq 150 --Nk 221 \
    --D 256 --causal --iters 1 --warmup 0 --check --no-peers --variant 'bwd-roles*' > "$out/san_$tool.log" 2>&1
  echo "$tool: rc=$? $(grep -E 'SUMMARY' "$out/san_$tool.log" | tail -1)"
done
echo "done ${SECONDS}s"
