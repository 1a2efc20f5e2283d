#!/usr/bin/env bash
# Session 7: rung 10 with red_free counting 256 arrivals (every reader releases
# its own reads): gpu_check's racecheck at D=1024 six times, checks on odd
# shapes, and the D=1024 benchmark row (before: 8.874 ms, 247.8 TFLOPS, 44f1a1c).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
racecheck_runs 6
for s in "--Nq 1 --Nk 1 --D 1024" "--Nq 17 --Nk 1000 --D 1024 --causal" "--Nq 129 --Nk 127 --D 512 --dtype bf16" "--Nq 1000 --Nk 129 --D 1024 --causal --dtype bf16" "--Nq 127 --Nk 4096 --D 1024"; do
  echo "check $s: $(timeout 60 $F --B 2 --H 3 $s --variant 'cluster*' --check --iters 1 --warmup 0 --show-all 2>&1 | grep -E 'cluster' | grep -oE 'PASS|FAIL|unsupported' | sort | uniq -c | tr '\n' ' ')"
done
for d in 1024 512; do
  timeout 60 $F --B 1 --H 8 --N 8192 --D $d --variant 'cluster*' --iters 10 --warmup 2 --show-all 2>&1 | grep -E "cluster" | sed -E 's/\[[^]]*\]//' | cut -c1-110
done
el done
