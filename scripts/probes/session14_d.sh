#!/usr/bin/env bash
# Session 14, fourth device call (ran at a1df5ea, where --dma-d64-blocks existed): the forward's wgmma kernel at D = 64 with
# four blocks per SM as the default (128 registers, 4 bytes spilled; the
# in-kernel scan's row batch 4 instead of 8, which at 128 registers spilled
# inside scan_words and made top-1024 L=16K 0.093 ms against 0.052 in
# session14_c) against three (--dma-d64-blocks 3, 161 registers): the
# forward's tests on the new default, then alternating, twice; peers once.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 250 test_dmattn
A="--B 1 --H 8 --N 8192 --D 64 --mask ones --bias"
T="--B 1 --H 2 --Hkv 1 --D 64 --causal --mask topk --window 1024 --bias"
for rep in 1 2; do
  for nb in 3 0; do
    echo "all-ones D=64 blocks=$nb auto:      $(dm_time $A --dma-d64-blocks $nb)"
    echo "all-ones D=64 blocks=$nb in-kernel: $(dm_time $A --dma-d64-blocks $nb --dma-mask-scan in-kernel)"
    echo "bias only D=64 blocks=$nb:          $(dm_time --B 1 --H 8 --N 8192 --D 64 --bias --dma-d64-blocks $nb)"
    echo "top-1024 L=16K D=64 blocks=$nb:     $(dm_time $T --N 16384 --dma-d64-blocks $nb)"
    echo "top-1024 L=32K D=64 blocks=$nb:     $(dm_time $T --N 32768 --dma-d64-blocks $nb)"
    echo "causal D=64 N=8192 blocks=$nb:      $(dm_time --B 1 --H 8 --N 8192 --D 64 --Hkv 8 --causal --dma-d64-blocks $nb)"
  done
done
timeout 120 $F $A --sdpa --torch --iters 20 --warmup 3 2>&1 | grep -E "dmattn|split-q|sdpa|torch" | cut -c1-150
el done
