#!/usr/bin/env bash
# Session-5 probe A: the three branches never run on a GPU (next/fwd-pdl,
# next/bwd-fastpath, next/bwd-wgmma), merged: their tests, sanitizer on the
# new code paths, and A/B timings (PDL on/off through ATTNLAB_NO_PDL; the
# backward's wgmma core against the mma.sync core with the fast path).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_backward test_dmattn_summary
run_test 300 test_dmattn_backward
run_test 100 test_dmattn_summary
run_test 240 test_dmattn
for tool in memcheck racecheck; do
  for shape in "--Nq 200 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 48 --bias --bwd-chunks 3" \
               "--Nq 130 --Nk 333 --D 128 --mask topk --window 64 --bias --bwd" \
               "--Nq 1 --Nk 3000 --D 128 --Hkv 1 --mask topk --window 64 --bias --splits 4"; do
    r=$(timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 $shape --check --iters 1 --warmup 0 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAIL" | head -3 | tr '\n' ' ')
    el "$tool [$shape]: $r"
  done
done
D="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"
for N in 32768; do
  $F $D --N $N --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed 's/^/PDL    /'
  ATTNLAB_NO_PDL=1 $F $D --N $N --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed 's/^/no-PDL /'
  $F $D --N $N --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed 's/^/PDL    /'
done
for Nk in 32768 524288; do
  $F $D --block 0 --Nq 1 --Nk $Nk --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed 's/^/PDL    /'
  ATTNLAB_NO_PDL=1 $F $D --block 0 --Nq 1 --Nk $Nk --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed 's/^/no-PDL /'
done
el "backward all-ones + bias, H=8 N=8192"
for d in 128 64; do
  for core in auto mma; do
    timeout 60 $F --B 1 --H 8 --N 8192 --D $d --mask ones --bias --bwd --dma-core $core --iters 10 --warmup 2 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed "s/^/D=$d $core /"
  done
done
timeout 90 $F --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --bwd --sdpa --iters 10 --warmup 2 2>&1 | grep -E "^ *(sdpa|torch)" | cut -c1-150
for N in 16384 32768; do
  for core in auto mma; do
    timeout 60 $F $D --N $N --bwd --dma-core $core --iters 10 --warmup 2 2>&1 | grep -E "^ *dmattn" | cut -c1-150 | sed "s/^/L=$N $core /"
  done
done
el "causal all-ones bwd D=128 N=8192 (no bias)"
timeout 60 $F --B 1 --H 8 --N 8192 --D 128 --causal --mask ones --bwd --iters 10 --warmup 2 2>&1 | grep -E "^ *dmattn" | cut -c1-150
el done
tar czf $O/logs.tgz -C /tmp logs
