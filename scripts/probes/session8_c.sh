#!/usr/bin/env bash
# Session 8: the key-gather decoding core (dma_decode_kernel, automatic for
# Nq = 1 with a mask) — test_dmattn (its decode cases: every D, sparse and
# dense, chunks, splits, GQA, softcap, misaligned K/V), memcheck and
# racecheck on decode shapes, then the decode table's rows against the tile
# kernel (--dma-core wgmma) and the peers in the same run, and a dense mask.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
for args in "--B 2 --H 4 --Hkv 2 --Nq 1 --Nk 20000 --D 128 --mask topk --window 512 --bias --softcap 20 --splits 5" \
            "--B 1 --H 2 --Hkv 1 --Nq 1 --Nk 3000 --D 256 --causal --mask topk --window 300 --block 0 --bias"; do
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F $args --iters 1 --warmup 0 --check > $L/$tool.log 2>&1
    el "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log) $(grep -E '^ *dmattn:' $L/$tool.log | grep -oE '(PASS|FAIL) err[^;]*')"
  done
done
T="--B 1 --H 2 --Hkv 1 --Nq 1 --D 128 --causal --mask topk --window 1024 --block 0 --bias"
for Nk in 4096 65536 524288; do
  for c in auto wgmma; do echo "decode Nk=$Nk core $c: $(dm_time $T --Nk $Nk --dma-core $c)"; done
done
echo "decode Nk=524288 block 64: $(dm_time --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --bias)"
for c in auto wgmma; do echo "decode dense (all ones) Nk=65536 core $c: $(dm_time --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias --dma-core $c)"; done
echo "== the table row, peers in the same run"
timeout 60 $F $T --Nk 524288 --check --iters 20 --warmup 3 2>&1 | grep -E "^ *(dmattn|sdpa|torch)" | cut -c1-200
el done
