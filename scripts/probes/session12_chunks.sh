#!/usr/bin/env bash
# Session 12, last call: the Python tests on the final backward (Q/dO by TMA),
# and the query-chunk sweep again now that a tile's dQ epilogue and loads are
# cheaper (session 10's sweep chose today's rule).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma attnlab_python
timeout 200 ctest --test-dir $B -R gpu_python --output-on-failure > $L/pytest.log 2>&1; el "pytest rc=$? $(grep -E 'passed|failed' $L/pytest.log | tail -1)"
grep -E "FAILED|Error" $L/pytest.log | head -5
dense=$BWD_DENSE
sparse=$BWD_SPARSE
for D in 128 64; do for c in 0 1 2 4 8; do echo "all-active D=$D chunks ${c/#0/auto}: $(bwd_row $F $dense --D $D --bwd-chunks $c)"; done; done
for N in 8192 16384 32768; do for c in 0 8 16 32; do echo "top-1024 L=$N chunks ${c/#0/auto}: $(bwd_row $F $sparse --N $N --bwd-chunks $c)"; done; done
echo "deterministic D=128: $(bwd_row $F $dense --D 128 --deterministic)"
el done
