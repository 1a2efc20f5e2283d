#!/usr/bin/env bash
# One-off probe (removed in the next commit): the interleaved timer with a queued
# GPU delay against the sequential one, same shapes, every row. Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"; b=build-gpu
{ cmake -S . -B $b -DCMAKE_CUDA_ARCHITECTURES=90a -G Ninja && cmake --build $b -j 16 --target flash_attn_mma; } > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
echo "build done at $SECONDS s"
for shape in "--D 64" "--D 128" "--D 256" "--D 128 --causal"; do
  for mode in sequential interleaved sequential interleaved; do
    [ $SECONDS -gt 250 ] && break 2
    env $([ $mode = sequential ] && echo ATTNLAB_SEQUENTIAL_TIMING=1) $b/flash_attn_mma --B 1 --H 8 --N 8192 $shape \
      --no-check --show-all --iters 20 --warmup 3 > "$out/run.txt" 2>&1
    printf '%-16s %-12s' "$shape" "$mode"
    for r in 'sdpa\(cudnn\)' 'sdpa\(flash\)' 'ws\+stage2' 'ws\+stage2\+pingpong' 'wgmma\+stage2\+overlap' 'minimal'; do
      printf ' %s' "$(grep -E "^ *$r:" "$out/run.txt" | sed -E 's/.*time:([0-9.]+)ms.*TFLOPS:([0-9.]+).*/\2/' | head -1)"
    done
    echo
  done
done | tee "$out/probe.txt"
echo "columns: cudnn flash ws+stage2 ws+pp wgmma+overlap minimal (TFLOPS); done at $SECONDS s" | tee -a "$out/probe.txt"
