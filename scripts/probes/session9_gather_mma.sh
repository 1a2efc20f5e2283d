#!/usr/bin/env bash
# Branch next/gather-mma (written in session 8, not yet run): the gather
# decode core's scores on tensor cores (mma.m16n8k16, q as row 0 of A,
# gathered K rows padded by 16 bytes as B). Checks, then the decode rows it
# is for — dense (all ones, and the table's Nk <= 1024 where W = 1024 keeps
# every key) against the tile kernel, and the sparse 512K row.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 20000 --D 256 --mask topk --window 3000 --block 0 --bias --softcap 20 --splits 1 --iters 1 --warmup 0 --check > $L/race.log 2>&1
el "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' $L/race.log)"
for c in auto wgmma; do echo "dense Nk=65536 core $c: $(dm_time --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias --dma-core $c)"; done
T="--B 1 --H 2 --Hkv 1 --Nq 1 --D 128 --causal --mask topk --window 1024 --block 0 --bias"
for Nk in 256 1024 4096 524288; do
  for c in auto wgmma; do echo "decode Nk=$Nk core $c: $(dm_time $T --Nk $Nk --dma-core $c)"; done
done
el done
