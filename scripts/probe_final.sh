#!/usr/bin/env bash
# One-off probe: the GPU block-mask builder's test (built alone, by nvcc),
# then rung 13 with K and V in registers timed beside sdpa(flash) bwd, checked.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"; SECONDS=0
N="nvcc -std=c++17 -O2 -I kernels -I tests/gpu --generate-code=arch=compute_90a,code=sm_90a"
$N -c -x cu tests/gpu/test_block_mask_gpu.cpp -o /tmp/t1.o & $N -c kernels/blocksparse/block_mask_gpu.cu -o /tmp/t2.o &
$N -c kernels/blocksparse/block_mask.cpp -o /tmp/t3.o & wait
$N /tmp/t1.o /tmp/t2.o /tmp/t3.o -o /tmp/tbm && timeout 60 /tmp/tbm > "$out/block_mask.txt" 2>&1
echo "test_block_mask_gpu rc=$? at $SECONDS s: $(tail -1 "$out/block_mask.txt")"; grep FAIL "$out/block_mask.txt" | head -5
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=ON > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j16 --target flash_attn_mma >> "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "built at $SECONDS s"
for a in "--D 64" "--D 64 --causal"; do
  timeout 30 build-gpu/flash_attn_mma --bwd --B 1 --H 8 --N 8192 $a --sdpa --check --show-all --iters 20 --warmup 3 --variant 'bwd-mma*' --csv "$out/bwd.csv" > /tmp/r.txt 2>&1
  echo "rc=$? $a"; grep -E "bwd-mma|sdpa\((cudnn|flash)\)" /tmp/r.txt | cut -c1-150
done
echo "done at $SECONDS s"
