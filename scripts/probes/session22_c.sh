#!/usr/bin/env bash
# Session 22 (c): the clock the H200 sustains under D = 1024 attention, read
# (never set) with nvidia-smi while (1) cuBLAS's two GEMMs run back to back
# (scripts/gemm_ceiling.py now prints it with the dense tensor-core peak at
# that clock), (2) rung 11 runs 400 times, (3) the unfused baselines run.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
timeout 150 python3 scripts/gemm_ceiling.py --D 1024 512
el ceiling
sampled() {  # sampled LABEL ARGS... : the harness under nvidia-smi's 50 ms SM clock / power samples
  local label=$1; shift
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 50 > $L/smi.csv &
  local pid=$!
  timeout 120 $F --B 1 --H 8 --N 8192 --D 1024 "$@" 2>&1 | grep -E "^ *(two-pass|unfused|torch)" | cut -c1-120
  kill $pid; wait $pid 2>/dev/null
  python3 - "$label" $L/smi.csv <<'PY'
import statistics, sys
rows = [[float(x) for x in l.split(",")] for l in open(sys.argv[2]) if l.count(",") == 2]
busy = [r for r in rows if r[1] > 300]  # samples under load (idle draws ~100 W)
if busy:
    print(f"{sys.argv[1]}: {len(busy)} of {len(rows)} samples above 300 W: SM clock median {statistics.median(r[0] for r in busy):.0f} MHz "
          f"(min {min(r[0] for r in busy):.0f}), power median {statistics.median(r[1] for r in busy):.0f} W, "
          f"temperature max {max(r[2] for r in busy):.0f} C")
else:
    print(f"{sys.argv[1]}: no sample above 300 W ({len(rows)} samples)")
PY
}
sampled rung11 --variant 'two-pass+stage4' --iters 400 --warmup 5
sampled unfused-baselines --variant 'split-kv+stage1' --torch --iters 150 --warmup 3
sampled rung11-again --variant 'two-pass+stage4' --iters 400 --warmup 5
el done
