#!/usr/bin/env bash
# Session 9: the backward's wgmma core software-pipelined inside a tile (slice
# s+1's S and dP issued before slice s's dV/dK, which run under slice s+1's
# score code; two slices at D = 64 too). Checks (test_dmattn_backward, racecheck at D = 128 default and
# deterministic), then the all-active rows (and sdpa peers at D = 128) and the
# sparse L = 16K / 32K rows.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
for s in "--Nq 200 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 48 --bias --bwd --bwd-chunks 3" \
         "--Nq 130 --Nk 77 --D 128 --mask topk --window 16 --block 0 --bias --bwd" \
         "--Nq 70 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 32 --bias --bwd"; do
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 $s --iters 1 --warmup 0 --check > $L/race.log 2>&1
  el "racecheck rc=$? $s $(grep -E 'RACECHECK SUMMARY' $L/race.log)"
done
bw() { timeout 60 $F "$@" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd:" | cut -c1-110; }
for D in 128 64; do echo "all-active D=$D: $(bw --B 1 --H 8 --N 8192 --D $D --mask ones --bias)"; done
for N in 16384 32768; do echo "top-1024 L=$N: $(bw --B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias)"; done
el done
