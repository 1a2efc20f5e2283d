#!/usr/bin/env bash
# Session 7: gpu_check's exact racecheck command at D=1024 causal, 6 times; logs kept.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
for i in 1 2 3 4 5 6; do
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
    --iters 1 --warmup 0 --check --show-all > $L/race$i.log 2>&1; rc=$?
  el "run $i rc=$rc $(grep -c -E '^ *[a-z0-9+-]+.*(PASS|FAIL)' $L/race$i.log) rows $(grep -E 'RACECHECK SUMMARY' $L/race$i.log)"
  [ $rc != 0 ] && { grep -v "^=========     " $L/race$i.log | grep -E "=========|FAIL|rror" | head -20 | cut -c1-220; cp $L/race$i.log $O/; }
done
el done
