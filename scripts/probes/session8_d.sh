#!/usr/bin/env bash
# Session 8: the key-gather decoding core after its softmax step moved to one
# warp (probabilities computed once per key, not per thread) — test_dmattn,
# then the decode rows against the tile kernel, sparse and dense, and the
# table row with its peers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
T="--B 1 --H 2 --Hkv 1 --Nq 1 --D 128 --causal --mask topk --window 1024 --block 0 --bias"
for Nk in 4096 524288; do
  for c in auto wgmma; do echo "decode Nk=$Nk core $c: $(dm_time $T --Nk $Nk --dma-core $c)"; done
done
for c in auto wgmma; do echo "decode dense (all ones) Nk=65536 core $c: $(dm_time --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias --dma-core $c)"; done
for c in auto wgmma; do echo "decode W=8192 Nk=65536 core $c: $(dm_time --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask topk --window 8192 --block 0 --bias --dma-core $c)"; done
echo "== the table row, peers in the same run"
timeout 60 $F $T --Nk 524288 --check --iters 20 --warmup 3 2>&1 | grep -E "^ *(dmattn|sdpa|torch)" | cut -c1-200
el done
