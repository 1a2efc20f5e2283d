#!/usr/bin/env bash
# Session-5 probe E: the launch-helper refactor (launch_with_attribute) on the
# GPU: rungs 09/10 (clustered launch) checked at D = 512 / 1024, the dmattn
# forward tests (overlapped launches), and the L=32K / decoding rows.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
for shape in "--N 129 --D 512" "--Nq 127 --Nk 1000 --D 1024 --causal" "--N 1000 --D 1024 --dtype bf16" "--N 17 --D 512 --causal"; do
  $F --B 1 --H 2 $shape --check --iters 2 --warmup 1 > $L/rungs.log 2>&1; rc=$?
  el "check [$shape] rc=$rc: $(grep -cE 'PASS' $L/rungs.log) PASS, $(grep -cE 'FAIL' $L/rungs.log) FAIL; $(grep -E 'split-d' $L/rungs.log | cut -c1-60 | tr '\n' ' ')"
done
run_test 200 test_dmattn
D="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"
$F $D --N 32768 --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-80
$F $D --block 0 --Nq 1 --Nk 524288 --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" | cut -c1-80
el done
tar czf $O/logs.tgz -C /tmp logs
