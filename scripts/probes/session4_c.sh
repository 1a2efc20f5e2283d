#!/usr/bin/env bash
# Session-4 probe C: the forward's overlapped wgmma core and the backward's
# query chunks (next/bwd-qchunks): tests, A/B timings, SDPA at L=16K.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_backward
run_test 240 test_dmattn
run_test 240 test_dmattn_backward
row() { echo "== $*"; timeout 90 $F --B 1 "$@" --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|split-q|sdpa|torch)|error" | cut -c1-210; }
for D in 128 64; do
  row --H 8 --N 8192 --D $D --mask ones --bias
  row --H 8 --N 8192 --D $D --mask ones --bias --dma-core mma
done
row --H 8 --N 8192 --D 128 --mask ones
row --H 8 --N 8192 --D 128 --mask ones --bias --causal
row --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias
el fwd
for N in 16384 32768; do for c in 1 8 16 32 0; do
  row --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias --bwd-chunks $c | grep bwd; done; done
row --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --bwd --check --sdpa
row --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --deterministic --check
for c in 1 4 8 0; do row --H 8 --N 8192 --D 128 --mask ones --bias --bwd-chunks $c | grep bwd; done
el bwd
echo "memcheck: $(timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 32 --bias --bwd --bwd-chunks 3 --iters 1 --warmup 0 --check 2>&1 | grep -E 'ERROR SUMMARY|FAIL' | tr '\n' ' ')"
echo "racecheck wgmma: $(timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 --Nq 130 --Nk 300 --D 128 --causal --mask topk --window 64 --bias --iters 1 --warmup 0 --check 2>&1 | grep -E 'RACECHECK SUMMARY|FAIL' | tr '\n' ' ')"
el sanitizer
tar czf $O/logs.tgz -C /tmp logs
