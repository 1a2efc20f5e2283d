#!/usr/bin/env bash
# Session 12, closing run at the new commits: the Python autograd tests (the
# backward changed), gpu_check's D = 1024 benchmark row set (rung 10 against
# the torch peers, CSV), and the dmattn backward table.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma attnlab_python
timeout 200 ctest --test-dir $B -R gpu_python --output-on-failure > $L/pytest.log 2>&1; el "pytest rc=$? $(grep -E 'passed|failed' $L/pytest.log | tail -1)"
grep -E "FAILED|Error" $L/pytest.log | head -5
timeout 240 $F --B 1 --H 8 --N 8192 --D 1024 --torch --sdpa --check --show-all --iters 20 --warmup 3 --csv $O/bench_d1024.csv > $O/bench_d1024.txt 2>&1
el "bench D=1024 rc=$?"; grep -vE "^-+$" $O/bench_d1024.txt | cut -c1-160
BUILD_DIR=$B DMATTN_OUT=$O/dmattn TABLES=bwd timeout 300 scripts/dmattn_tables 2>&1 | cut -c1-170
el done
