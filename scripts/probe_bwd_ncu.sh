#!/usr/bin/env bash
# One-off probe: the backward rungs' variant tests at HEAD, then Nsight Compute
# (stall samples per SASS line, pipe use) on rung 14 at D = 128 and rung 15 at D = 256.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"; SECONDS=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_BUILD_TESTS=ON > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j16 --target flash_attn_mma test_gpu_bwd_variants >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built at $SECONDS s; spills: $(grep -c 'Registers are spilled' "$out/build.log")"
timeout 120 build-gpu/test_gpu_bwd_variants > "$out/tests.txt" 2>&1; echo "test_gpu_bwd_variants rc=$? at $SECONDS s: $(tail -1 "$out/tests.txt")"
B=build-gpu/flash_attn_mma
NCU=(ncu --clock-control none --set full --import-source yes)
timeout 120 "${NCU[@]}" -k regex:bwd_ws_kernel -c 1 -o /tmp/ws128 $B --B 1 --H 8 --N 8192 --D 128 --bwd \
  --variant bwd-ws --no-peers --no-check --warmup 0 --iters 1 > /tmp/ws128.log 2>&1; echo "ncu ws128 rc=$? at $SECONDS s"
timeout 120 "${NCU[@]}" -k regex:bwd_roles -c 1 -o /tmp/roles256 $B --B 1 --H 8 --N 8192 --D 256 --bwd \
  --variant bwd-roles --no-peers --no-check --warmup 0 --iters 1 > /tmp/roles256.log 2>&1; echo "ncu roles256 rc=$? at $SECONDS s"
for r in ws128 roles256; do
  ncu --import /tmp/$r.ncu-rep --page details --print-units base > "$out/$r.txt" 2>&1
  ncu --import /tmp/$r.ncu-rep --page raw --csv 2>/dev/null | gzip > "$out/${r}_raw.csv.gz"
  ncu --import /tmp/$r.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > "$out/${r}_sass.csv.gz"
done
tail -3 /tmp/ws128.log /tmp/roles256.log
echo "done at $SECONDS s"
