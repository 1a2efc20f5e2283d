#!/usr/bin/env bash
# Session 10: the backward's wgmma core with two Q/dO (+LSE, Δ) slots — the
# next active slot's tiles copied while this one is computed. First run: dQ
# back to atomics at D = 128 (a separate bulk staging buffer would leave one
# block per SM; session10_bwd_prefetch_atomics.txt); second: dQ staged in the
# tile's own, dead, Q/dO slot (session10_bwd_prefetch.txt, kept).
# Checks (test_dmattn_backward; racecheck/memcheck; --check runs with more
# than one batch of 128 slots and with chunks), then a same-run A/B against
# the file before (ab/dmattn_bwd_before.cu, untracked: `git show 533823c:kernels/dmattn/dmattn_bwd.cu`;
# bulk dQ at D = 128, one slot).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
bwd_sanitizers
for s in "--H 4 --Hkv 1 --N 2500 --D 128 --mask ones --bias" "--H 4 --Hkv 1 --N 2500 --D 64 --mask topk --window 300 --bias --causal" \
         "--H 4 --Hkv 2 --Nq 3000 --Nk 1000 --D 128 --mask topk --window 200 --bias --bwd-chunks 3" "--H 4 --Hkv 1 --N 2500 --D 128 --mask ones --bias --deterministic"; do
  timeout 120 $F --B 2 $s --bwd --iters 1 --warmup 0 --check > $L/chk.log 2>&1
  el "check rc=$? $s: $(grep -cE 'PASS' $L/chk.log) PASS $(grep -cE 'FAIL' $L/chk.log) FAIL"
done
bw() { timeout 60 $F "$@" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd:" | cut -c1-110; }
rows() {
  for D in 128 64; do echo "$1 all-active D=$D: $(bw --B 1 --H 8 --N 8192 --D $D --mask ones --bias)"; done
  for N in 16384 32768; do echo "$1 top-1024 L=$N: $(bw --B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias)"; done
}
rows new
cp kernels/dmattn/dmattn_bwd.cu /tmp/new_bwd.cu && cp ab/dmattn_bwd_before.cu kernels/dmattn/dmattn_bwd.cu
cmake --build $B -j 16 --target flash_attn_mma > $L/build_before.log 2>&1 || tail -20 $L/build_before.log
el "rebuilt before"
rows before
cp /tmp/new_bwd.cu kernels/dmattn/dmattn_bwd.cu && cmake --build $B -j 16 --target flash_attn_mma > $L/build_new.log 2>&1
rows new
el done
