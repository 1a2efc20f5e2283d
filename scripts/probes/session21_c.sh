#!/usr/bin/env bash
# Session 21 (c): where pass 1's steps spend their cycles. session21_b: the
# staggered schedule runs with no serialised wgmma, but pass 1 takes 2.12 ms
# at 62 % tensor-pipe activity (the landed one-accumulator pass 1: 1.79 ms,
# 79 %). A copy of the tree whose rung 11 carries clock() counters
# (scripts/probes/r11_trace.py), built without torch, prints per run of steps
# the cycles in the slot wait, the MMA issue, wgmma_wait<1> and the epilogue.
# Ran on probe b's version (an earlier form of r11_trace.py; today's applies to
# the patch's last version).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
T=/tmp/trace; mkdir -p $T && git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $T
python3 scripts/probes/r11_trace.py kernels/flash_attn/11_two_pass.cu $T/kernels/flash_attn/11_two_pass.cu || exit 1
{ cmake -S $T -B $T/b -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF &&
  cmake --build $T/b -j 16 --target flash_attn_mma; } > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
el built
for D in 1024 256; do
  echo "D=$D:"; timeout 60 $T/b/flash_attn_mma --B 1 --H 8 --N 8192 --D $D --variant 'two-pass+stage4' --iters 3 --warmup 1 2>&1 | grep -E "trace|two-pass" | tail -12
done
el done
