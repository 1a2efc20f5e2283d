#!/usr/bin/env bash
# Session 15, second device call: the backward's dQ parts issued together at
# D = 128 (Cfg::kDqPartsTogether, compile-time ATTNLAB_PROBE_DQ_PARTS_TOGETHER=1:
# 248 registers, no spill, still two blocks per SM; the default 228): part 1's
# dQ = dS·K runs under part 0's stores. Two builds (A: this tree as is, B:
# with the macro), --check and sanitizers on B, then A against B alternating,
# twice, on the all-active, causal and sparse D = 128 shapes. (It won; the
# macro is gone since: kDqPartsTogether is the default at D = 128.)
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_ab "-DATTNLAB_PROBE_DQ_PARTS_TOGETHER=1" flash_attn_mma
C="--iters 1 --warmup 0 --check"
for s in "--B 1 --H 2 --Nq 200 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 64 --bias" \
         "--B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 777 --D 128 --causal --mask topk --window 400 --bias --dtype bf16" \
         "--B 1 --H 3 --Hkv 1 --Nq 127 --Nk 17 --D 128 --mask topk --window 8 --block 0 --bias --softcap 15" \
         "--B 1 --H 2 --Nq 1 --Nk 1000 --D 128 --bias" \
         "--B 1 --H 2 --Nq 129 --Nk 60 --D 128 --causal --bias --bwd-chunks 3" \
         "--B 1 --H 8 --N 1024 --D 128 --mask ones --bias"; do
  echo "B $s: $($FB $s --bwd $C 2>&1 | grep -E 'dmattn bwd:' | cut -c30-150)"
  echo "B det: $($FB $s --bwd --deterministic $C 2>&1 | grep -E 'dmattn bwd \(det' | cut -c30-150)"
done
for tool in racecheck memcheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $FB --B 1 --H 2 --Nq 200 --Nk 130 --D 128 --Hkv 1 --causal \
    --mask topk --window 64 --bias --bwd --bwd-chunks 3 $C > $L/san.log 2>&1
  el "$tool (B) rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' $L/san.log)"
done
FO=$F; F=$FB  # bwd_ab: "old" = A (the default), "new" = B
for rep in 1 2; do
  bwd_ab "all-active D=128" $BWD_DENSE --D 128
  bwd_ab "all-active causal D=128" $BWD_DENSE --D 128 --causal
  bwd_ab "top-1024 L=16K" $BWD_SPARSE --N 16384
  bwd_ab "top-1024 L=32K" $BWD_SPARSE --N 32768
  bwd_ab "GQA H=8 Hkv=2 N=4096 causal" --B 2 --H 8 --Hkv 2 --N 4096 --D 128 --causal --bias
done
F=$FO
timeout 120 $F $BWD_DENSE --D 128 --bwd --sdpa --iters 10 --warmup 2 2>&1 | grep -E "bwd[^:]*:" | cut -c1-150
el done
