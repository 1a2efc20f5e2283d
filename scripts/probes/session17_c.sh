#!/usr/bin/env bash
# Session 17, profiles for the next session (ncu PC sampling per SASS line and
# the stall reasons, at a0b1020's kernels) of the three unmet targets: the
# dmattn backward at D = 64 (all-ones + bias), the dmattn forward at D = 64
# (all-ones + bias, in-kernel mask scan, and the same with --mask none: bias
# only), and rung 10 (+push) at D = 1024. N = 4096 so each kernel replays
# quickly; the top lines go to $OUT/*_top.txt (scripts/probes/ncu_source_top.py).
cd "$(dirname "$0")/../.." && . scripts/probes/common.sh
{ cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF && cmake --build $B -j 16 --target flash_attn_mma; } > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
el built
NCU="timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy --section MemoryWorkloadAnalysis --import-source yes --launch-count 1 -f"
prof() {  # prof NAME KERNEL_REGEX ARGS...
  local n=$1 k=$2; shift 2
  $NCU -k regex:$k -o $L/$n $F "$@" --iters 1 --warmup 0 > $L/${n}_run.txt 2>&1
  el "ncu $n rc=$?"
  ncu -i $L/$n.ncu-rep --print-details all > $O/${n}_details.txt 2>&1
  ncu -i $L/$n.ncu-rep --page source --csv --print-source sass > $L/${n}_sass.csv 2>$L/${n}_src.err || head -3 $L/${n}_src.err
  python3 scripts/probes/ncu_source_top.py $L/${n}_sass.csv 45 > $O/${n}_top.txt 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Theoretical Occ|Block Limit" $O/${n}_details.txt | head -12 | cut -c1-150
  head -2 $O/${n}_top.txt | cut -c1-300
}
prof bwd64 dma_bwd_kernel --B 1 --H 8 --N 4096 --D 64 --mask ones --bias --bwd
prof fwd64_ones dma_forward_kernel --B 1 --H 8 --N 4096 --D 64 --mask ones --bias --dma-mask-scan in-kernel
prof fwd64_bias dma_forward_kernel --B 1 --H 8 --N 4096 --D 64 --bias
prof r10 cluster_split_d_kernel --B 1 --H 8 --N 4096 --D 1024 --variant 'cluster-split-d+stage1+push'
tar czf $O/profiles_sass.tgz -C $L bwd64_sass.csv fwd64_ones_sass.csv fwd64_bias_sass.csv r10_sass.csv
el done
