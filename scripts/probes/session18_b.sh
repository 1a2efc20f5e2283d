#!/usr/bin/env bash
# Session 18: where the all-active backward's call time goes, kernel by kernel
# (ours: pre-pass kernels, memsets, Δ, the main kernel, conversions; FA2's:
# its dot(dO, O), main kernel and dQ conversion), by ncu's duration of every
# kernel of one harness run (--iters 1 --warmup 0, forward rows included;
# ncu --clock-control none, one metric, so one pass per kernel).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
[ -x $F ] || probe_build flash_attn_mma
for D in 64 128; do
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --print-units base --csv \
    $F --B 1 --H 8 --N 8192 --D $D --mask ones --bias --bwd --sdpa --iters 1 --warmup 0 > $L/ncu_$D.csv 2> $L/ncu_$D.err
  el "ncu D=$D rc=$? $(wc -l < $L/ncu_$D.csv) lines"; cp $L/ncu_$D.csv $O/
  python3 - "$L/ncu_$D.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1]))]
at = next(i for i, r in enumerate(rows) if "Kernel Name" in r)  # the harness's own output comes first
head = rows[at]; rows = [r for r in rows[at + 1:] if len(r) == len(head)]
iname = head.index("Kernel Name"); ival = head.index("Metric Value"); iid = head.index("ID")
for r in rows:
    name = r[iname]
    short = name.split("(")[0].split("<")[0][-60:]
    print(f"{r[iid]:>4} {float(r[ival].replace(',', '')) / 1000:10.1f} us  {short}  {name[:110] if 'dma' in name or 'flash' in name else ''}")
PY
done
el done
