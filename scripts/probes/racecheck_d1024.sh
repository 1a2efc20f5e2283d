#!/usr/bin/env bash
# Session 7: gpu_check's racecheck of the rungs at D=1024 causal (Nq 70, Nk 130)
# returned rc=9 once (passed at 37d6a7f; the rungs did not change since):
# which kernel, which hazard, and whether it repeats.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
for i in 1 2; do
  timeout 150 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
    --iters 1 --warmup 0 --check --show-all > $L/race$i.log 2>&1; el "run $i rc=$?"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|hazard|Race reported|FAIL" $L/race$i.log | sort | uniq -c | head -12
  grep -E "in void|kernel|__global__" $L/race$i.log | sed -E 's/0x[0-9a-f]+//g' | sort | uniq -c | sort -rn | head -8 | cut -c1-220
done
grep -B2 -A12 -m2 -E "hazard|Race reported" $L/race1.log | cut -c1-220
el done
tar czf $O/logs.tgz -C /tmp logs
