#!/usr/bin/env bash
# Session 12: where the time goes, per instruction, in the two kernels whose
# targets are unmet: the dmattn backward (all-ones + bias, D = 128) and rung
# 10 (D = 1024). ncu's PC sampling per SASS line (source page as CSV) plus the
# stall-reason breakdown; both reports come back under $OUT.
cd "$(dirname "$0")/../.." && . scripts/probes/common.sh
probe_build flash_attn_mma
NCU="timeout 240 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy --section MemoryWorkloadAnalysis --import-source yes"
$NCU -k regex:dma_bwd_kernel --launch-count 1 -f -o $L/bwd $F --B 1 --H 8 --N 4096 --D 128 --mask ones --bias --bwd --iters 1 --warmup 0 > $L/bwd_run.txt 2>&1
el "ncu bwd rc=$?"; tail -3 $L/bwd_run.txt
$NCU -k regex:cluster --launch-count 1 -f -o $L/r10 $F --B 1 --H 8 --N 4096 --D 1024 --variant 'cluster-split-d+stage1+push' --iters 1 --warmup 0 > $L/r10_run.txt 2>&1
el "ncu r10 rc=$?"; tail -3 $L/r10_run.txt
for r in bwd r10; do
  ncu -i $L/$r.ncu-rep --print-details all > $O/${r}_details.txt 2>&1
  ncu -i $L/$r.ncu-rep --page source --csv --print-source sass > $O/${r}_sass.csv 2>$L/${r}_src.err || { el "source page $r failed"; head -5 $L/${r}_src.err; }
  ls -la $O/${r}_sass.csv
  grep -E "Duration|Throughput|Stall|Warp Cycles|Achieved Occ|Registers|L2 Hit|Bank" $O/${r}_details.txt | head -60 | cut -c1-160
done
