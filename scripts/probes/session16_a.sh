#!/usr/bin/env bash
# Session 16, first device call: rung 10's new +stage2 (two 32-key K/V slots,
# the next tile's scores and their cluster exchange and softmax issued under
# P·V). Build; a one-tile check; the variant tests of rung 10; memcheck,
# racecheck (3 runs), synccheck of the new row at gpu_check's shape; then the
# D = 1024 benchmark twice (all three rung-10 rows in one process, peers in the
# same run) and causal once. SHOW=--show-all also prints the rows slower
# than the best so far (session16_b.sh).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
timeout 60 $F --B 1 --H 1 --Nq 64 --Nk 64 --D 1024 --variant 'cluster*' --check --iters 1 --warmup 0 --show-all 2>&1 | grep -E "cluster|rror" | cut -c1-160
el "one tile done"
run_test 300 test_gpu_variants 'cluster*'
variant_sanitizers 'cluster-split-d+stage2+push'
for rep in 1 2; do
  timeout 150 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'cluster*' --sdpa --torch --check ${SHOW:-} 2>&1 | grep -vE "^ *$" | cut -c1-150
  el "bench $rep"
done
timeout 120 $F --B 1 --H 8 --N 8192 --D 1024 --causal --variant 'cluster*' --torch --check ${SHOW:-} 2>&1 | grep -vE "^ *$" | cut -c1-150
el "causal done"
