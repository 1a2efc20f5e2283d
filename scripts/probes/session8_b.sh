#!/usr/bin/env bash
# (Runs against commit ed207c2: its --dma-bias-per-score flag was reverted with it.)
# Session 8: the bias inside the S MMA (wgmma core, query-broadcast bias:
# one more k16 step with A' = (1/scale hi, lo), B' = (bias, bias)) —
# test_dmattn, memcheck, then call times against --dma-bias-per-score (the
# old path) in the same run: all-ones + bias at D=64 and 128, bias without a
# mask, the top-1024 table shapes (L = 16K, 32K), decoding.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $F --B 2 --H 2 --Hkv 1 --Nq 200 --Nk 1000 --D 128 --causal --mask topk --window 256 --bias --softcap 20 --iters 1 --warmup 0 --check > $L/memcheck.log 2>&1
el "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.log) $(grep -E '^ *dmattn:' $L/memcheck.log | grep -oE 'PASS err[^;]*')"
A="--B 1 --H 8 --N 8192"
for D in 64 128; do
  for x in "" --dma-bias-per-score; do
    echo "D=$D ones+bias $x: $(dm_time $A --D $D --mask ones --bias $x)"
    echo "D=$D no mask, bias $x: $(dm_time $A --D $D --mask none --bias $x)"
  done
done
for N in 16384 32768; do
  T="--B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias"
  for x in "" --dma-bias-per-score; do echo "topk L=$N $x: $(dm_time $T $x)"; done
done
T="--B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --mask topk --window 1024 --bias"
for x in "" --dma-bias-per-score; do echo "decode 512K $x: $(dm_time $T $x)"; done
echo "D=64 ones+bias check: $(timeout 60 $F $A --D 64 --mask ones --bias --check --iters 2 --warmup 1 2>&1 | grep -E '^ *dmattn:' | grep -oE '(PASS|FAIL) err[^;]*')"
echo "D=128 ones+bias bf16 check: $(timeout 60 $F $A --D 128 --dtype bf16 --mask ones --bias --check --iters 2 --warmup 1 2>&1 | grep -E '^ *dmattn:' | grep -oE '(PASS|FAIL) err[^;]*')"
el done
