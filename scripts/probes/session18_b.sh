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
  python3 scripts/probes/ncu_kernel_times.py "$L/ncu_$D.csv"
done
el done
