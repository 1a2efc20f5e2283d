#!/usr/bin/env bash
# Session 12, last call: the Python tests on the final backward (Q/dO by TMA),
# and the query-chunk sweep again now that a tile's dQ epilogue and loads are
# cheaper (session 10's sweep chose today's rule).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma attnlab_python
timeout 200 ctest --test-dir $B -R gpu_python --output-on-failure > $L/pytest.log 2>&1; el "pytest rc=$? $(grep -E 'passed|failed' $L/pytest.log | tail -1)"
grep -E "FAILED|Error" $L/pytest.log | head -5
bw() { timeout 60 $F "$@" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd( \(deterministic\))?:" | sed -E 's/ +dmattn bwd[^:]*: time:/ /; s/, effective TFLOPS:/ ms /' | cut -c1-60; }
dense="--B 1 --H 8 --N 8192 --mask ones --bias"
sparse="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"
for D in 128 64; do for c in 0 1 2 4 8; do echo "all-active D=$D chunks ${c/#0/auto}: $(bw $dense --D $D --bwd-chunks $c)"; done; done
for N in 8192 16384 32768; do for c in 0 8 16 32; do echo "top-1024 L=$N chunks ${c/#0/auto}: $(bw $sparse --N $N --bwd-chunks $c)"; done; done
echo "deterministic D=128: $(bw $dense --D 128 --deterministic)"
el done
