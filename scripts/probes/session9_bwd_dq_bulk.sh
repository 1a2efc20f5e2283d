#!/usr/bin/env bash
# Session 9 (branch next/bwd-dq-bulk): the backward's wgmma core adds dQ by one
# bulk reduction per row from shared memory instead of fp32 atomics. Checks
# (test_dmattn_backward; racecheck and memcheck at D = 128 default and
# deterministic, D = 64), then the all-active rows and the sparse L = 16K /
# 32K rows. Before (9b081d0, gpu_check/tables): D=128 3.535 ms, L=16K
# 0.1857, 32K 0.1728; D=64 2.09 ms (same-run A/B: session9_bwd_dq_bulk_ab.txt).
# Second run: the bulk reduction at D = 128 only (kDqBulk).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 300 test_dmattn_backward
bwd_sanitizers
bw() { timeout 60 $F "$@" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd:" | cut -c1-110; }
for D in 128 64; do echo "all-active D=$D: $(bw --B 1 --H 8 --N 8192 --D $D --mask ones --bias)"; done
for N in 16384 32768; do echo "top-1024 L=$N: $(bw --B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias)"; done
el done
