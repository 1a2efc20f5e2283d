#!/usr/bin/env bash
# (Runs on 18322cd with scripts/probes/next_bwd_dq_epilogue.patch applied: the macros it names are in the patch.)
# Session 17, first device call: the backward's dQ epilogue without two of its
# block barriers (wgmma core). A: the tree then — each warp's lane 0 added its
# 16 rows of the staged dQ (boxes of 16 x 32) after a __syncwarp, and at D = 64
# dQ was staged in a 16 KiB buffer of its own, so no barrier waited for the
# Q/dO slot to die. B: -DATTNLAB_BWD_DQ_BLOCK_REDUCE=1
# -DATTNLAB_BWD_DQ_STAGE_IN_SLOT=1, the tree before (thread 0 adds the tile's
# 64-row boxes after a barrier; D = 64 stages in the slot). --check on A,
# test_dmattn_backward on A, the backward sanitizers on A, then B against A
# alternating, twice, and the peers once at D = 64 and 128. (A lost; the
# macro is now ATTNLAB_BWD_DQ_WARP_REDUCE=1, off by default. session17_b.sh
# measures the own stage alone.)
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_ab "-DATTNLAB_BWD_DQ_BLOCK_REDUCE=1 -DATTNLAB_BWD_DQ_STAGE_IN_SLOT=1" flash_attn_mma test_dmattn_backward
bwd_checks "--B 1 --H 2 --Nq 200 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 64 --bias" \
         "--B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 777 --D 64 --causal --mask topk --window 400 --bias --dtype bf16" \
         "--B 1 --H 3 --Hkv 1 --Nq 127 --Nk 17 --D 64 --mask topk --window 8 --block 0 --bias --softcap 15" \
         "--B 1 --H 2 --Nq 1 --Nk 1000 --D 64 --bias" \
         "--B 1 --H 2 --Nq 129 --Nk 60 --D 128 --causal --bias --bwd-chunks 3" \
         "--B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 777 --D 128 --causal --mask topk --window 400 --bias --dtype bf16" \
         "--B 1 --H 8 --N 1024 --D 64 --mask ones --bias" \
         "--B 1 --H 8 --N 1024 --D 128 --mask ones --bias"
FO=$FB  # bwd_ab: "old" = B (the tree before), "new" = A (this tree)
for rep in 1 2; do
  bwd_ab "all-active D=64" $BWD_DENSE --D 64
  bwd_ab "all-active D=128" $BWD_DENSE --D 128
  bwd_ab "all-active causal D=64" $BWD_DENSE --D 64 --causal
  bwd_ab "all-active causal D=128" $BWD_DENSE --D 128 --causal
  bwd_ab "top-1024 L=16K" $BWD_SPARSE --N 16384
  bwd_ab "top-1024 L=16K D=64" $BWD_SPARSE --N 16384 --D 64
done
el "A/B done"
for D in 64 128; do bwd_peers $BWD_DENSE --D $D; done
el done
