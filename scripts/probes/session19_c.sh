#!/usr/bin/env bash
# Session 19, after the review: test_dmattn_summary (its packed-mask forward
# case now reuses the case's buffers) and the harness rows that compare
# against the dmattn row's output, copied once (summary given, bit-packed).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_summary
run_test 150 test_dmattn_summary
rows() { timeout 120 $F "$@" --mask-bits --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|split-q)[^:]*:|rror" | cut -c1-200; }
rows --B 1 --H 8 --N 8192 --D 64 --mask ones --bias
rows --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias
rows --B 1 --H 2 --Hkv 1 --N 2048 --D 128 --causal --mask topk --window 512 --bias --check --deterministic
rows --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias
el done
