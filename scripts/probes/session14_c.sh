#!/usr/bin/env bash
# Session 14, third device call (ran at abd8556, where --dma-d64-blocks existed): (1) the backward's tests on the D = 64
# three-blocks default (3f79d6c); (2) the forward's wgmma kernel at D = 64
# bounded for four blocks per SM (DmaForwardArgs::d64_blocks,
# --dma-d64-blocks 4: 128 registers, 32 / 96 bytes spilled) against the
# default three (161 registers): --check on ragged shapes, then alternating,
# twice, on all-ones + bias (the issue's 0.9x-of-dense target, 0.70x now),
# bias without a mask and top-1024 L=16K, each mask scan; the dense rung and
# the torch peers in the same run.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 200 test_dmattn_backward
C="--iters 1 --warmup 0 --check"
for s in "--B 2 --H 4 --Hkv 2 --Nq 129 --Nk 200 --causal --mask topk --window 48 --bias" \
         "--B 1 --H 2 --Nq 1000 --Nk 1000 --mask ones --bias --dtype bf16" \
         "--B 1 --H 3 --Hkv 1 --Nq 127 --Nk 17 --mask topk --window 8 --bias --softcap 15" \
         "--B 1 --H 2 --Nq 300 --Nk 129 --causal --bias --dma-mask-scan in-kernel --mask ones" \
         "--B 1 --H 2 --Nq 1 --Nk 3000 --causal --mask topk --window 64 --bias --dtype bf16"; do
  echo "4 blocks $s: $($F --D 64 $s --dma-d64-blocks 4 $C 2>&1 | grep -E '^ *dmattn:' | cut -c30-130)"
done
A="--B 1 --H 8 --N 8192 --D 64 --mask ones --bias"
T="--B 1 --H 2 --Hkv 1 --N 16384 --D 64 --causal --mask topk --window 1024 --bias"
for rep in 1 2; do
  for nb in 0 4; do
    echo "all-ones D=64 blocks=$nb auto:      $(dm_time $A --dma-d64-blocks $nb)"
    echo "all-ones D=64 blocks=$nb in-kernel: $(dm_time $A --dma-d64-blocks $nb --dma-mask-scan in-kernel)"
    echo "all-ones D=64 blocks=$nb prepass:   $(dm_time $A --dma-d64-blocks $nb --dma-mask-scan prepass)"
    echo "bias only D=64 blocks=$nb:          $(dm_time --B 1 --H 8 --N 8192 --D 64 --bias --dma-d64-blocks $nb)"
    echo "top-1024 L=16K D=64 blocks=$nb:     $(dm_time $T --dma-d64-blocks $nb)"
  done
done
timeout 120 $F $A --dma-d64-blocks 4 --sdpa --torch --iters 20 --warmup 3 2>&1 | grep -E "dmattn|split-q|sdpa|torch" | cut -c1-150
el done
