#!/usr/bin/env bash
# One-off probe: the Hopper backward rungs' tests, their timings beside the
# SDPA peers at the issue's shapes, then the sanitizers on ragged shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"; SECONDS=0
export ATTNLAB_COMMIT=${ATTNLAB_COMMIT:-probe}
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_BUILD_TESTS=ON > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j16 --target flash_attn_mma test_gpu_bwd_variants >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built at $SECONDS s; spills: $(grep -c 'Registers are spilled' "$out/build.log"); C7512: $(grep -c C7512 "$out/build.log")"
for v in 'bwd-ws*' 'bwd-roles*'; do
  timeout 120 build-gpu/test_gpu_bwd_variants "$v" > "$out/tests.txt" 2>&1; echo "tests $v rc=$? at $SECONDS s: $(tail -1 "$out/tests.txt")"
done
B=build-gpu/flash_attn_mma
run() { timeout 100 $B --bwd --sdpa --check --show-all --iters 20 --warmup 3 --variant "${VARIANTS:-bwd-ws*,bwd-roles*}" --csv "$out/bwd.csv" "$@" > /tmp/run.txt 2>&1;
        echo "rc=$? $*"; grep -E "bwd-ws|bwd-roles|sdpa\((cudnn|flash)\)" /tmp/run.txt | grep -v unsupported | cut -c1-150; }
for d in 128 64 256; do for c in "" --causal; do run --B 1 --H 8 --N 8192 --D $d $c; done; done
run --B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal
run --B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16 --causal
echo "benchmarks done at $SECONDS s"
san() { for a in "--H 4 --Hkv 2 --Nq 150 --Nk 221 --D 256 --causal --variant bwd-roles*" "--B 2 --H 4 --Hkv 2 --Nq 257 --Nk 383 --D 64 --causal --variant bwd-ws*" \
           "--H 4 --Hkv 1 --Nq 383 --Nk 257 --D 128 --dtype bf16 --variant bwd-ws*" "--H 4 --Hkv 1 --Nq 129 --Nk 300 --D 192 --Dv 128 --causal --variant bwd-ws*"; do
    timeout 200 compute-sanitizer --tool $1 --error-exitcode 9 $B --bwd $a --iters 1 --warmup 0 --check --no-peers > /tmp/san_$1.txt 2>&1
    echo "$1 rc=$? $a: $(grep -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' /tmp/san_$1.txt | tail -1)"
  done > /tmp/san_$1.log; }
for tool in memcheck racecheck synccheck; do san $tool & done; wait
cat /tmp/san_*.log
echo "done at $SECONDS s"
