#!/usr/bin/env bash
# Session 20, first look at rung 11 (two passes): smoke checks, the variant
# tests of its rows, the D = 1024 / 512 benchmarks with every peer, and the
# sanitizers at gpu_check's D = 1024 causal shape.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
smoke() { timeout 60 $F "$@" --variant 'two-pass*' --check --show-all --iters 1 --warmup 0 2>&1 | grep -E "two-pass|rror" | cut -c1-230; }
smoke --B 1 --H 2 --Nq 70 --Nk 130 --D 1024
smoke --B 1 --H 2 --Nq 300 --Nk 700 --D 512 --causal
smoke --B 2 --H 3 --Nq 1000 --Nk 17 --D 768 --causal --dtype bf16
el smoke
run_test 420 test_gpu_variants 'two-pass*'
bench() { timeout 240 $F "$@" --sdpa --torch --check --show-all 2>&1 | grep -vE "^ *$" | cut -c1-230; el "bench $*"; }
bench --B 1 --H 8 --N 8192 --D 1024
bench --B 1 --H 8 --N 8192 --D 1024 --causal --variant 'two-pass*'
bench --B 1 --H 8 --N 8192 --D 512
variant_sanitizers 'two-pass+stage4'
el done
