#!/usr/bin/env bash
# (Runs on 18322cd with scripts/probes/next_bwd_dq_epilogue.patch applied: the macros it names are in the patch.)
# Session 17, second device call: the backward at D = 64 with dQ staged in a
# 16 KiB buffer of its own (DmaBwdConfig::kDqOwnStage; three blocks of 75 776
# bytes per SM) instead of the tile's Q/dO slot, so the barrier that waited
# for the slot to die is gone (thread 0 waits for its previous reductions'
# reads before the barrier ahead of dQ's product instead). A: this tree; B:
# -DATTNLAB_BWD_DQ_STAGE_IN_SLOT=1 (the tree before). --check on A (plain and
# deterministic), test_dmattn_backward, the sanitizers, then B against A
# alternating, twice, and the peers once at D = 64.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_ab "-DATTNLAB_BWD_DQ_STAGE_IN_SLOT=1" flash_attn_mma test_dmattn_backward
bwd_checks "--B 1 --H 2 --Nq 200 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 64 --bias" \
         "--B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 777 --D 64 --causal --mask topk --window 400 --bias --dtype bf16" \
         "--B 1 --H 3 --Hkv 1 --Nq 127 --Nk 17 --D 64 --mask topk --window 8 --block 0 --bias --softcap 15" \
         "--B 1 --H 2 --Nq 1 --Nk 1000 --D 64 --bias" \
         "--B 1 --H 2 --Nq 129 --Nk 60 --D 64 --causal --bias --bwd-chunks 3" \
         "--B 1 --H 8 --N 1024 --D 64 --mask ones --bias"
FO=$FB  # bwd_ab: "old" = B (the tree before), "new" = A (this tree)
for rep in 1 2; do
  bwd_ab "all-active D=64" $BWD_DENSE --D 64
  bwd_ab "all-active causal D=64" $BWD_DENSE --D 64 --causal
  bwd_ab "top-1024 L=16K D=64" $BWD_SPARSE --N 16384 --D 64
  bwd_ab "GQA H=8 Hkv=2 N=4096 causal D=64" --B 2 --H 8 --Hkv 2 --N 4096 --D 64 --causal --bias
done
bwd_ab "all-active D=128 (same code)" $BWD_DENSE --D 128
el "A/B done"
bwd_peers $BWD_DENSE --D 64
el done
