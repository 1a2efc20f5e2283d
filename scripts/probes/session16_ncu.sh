#!/usr/bin/env bash
# Session 16: where rung 10's time goes, against rung 09 at D = 512 — ncu's
# tensor-pipe activity and L2 throughput for the three rung-10 rows (D = 1024)
# and rung 09's single-block row (D = 512), B=1 H=8 N=8192 fp16.
cd "$(dirname "$0")/../.."
B=build-gpu; F=$B/flash_attn_mma
{ cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF && cmake --build $B -j 16 --target flash_attn_mma; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
show() { grep -E "split_d|gpu__|sm__|lts__" | sed -E 's/\(CUtensorMap.*//; s/attnlab::\(anonymous namespace\):://g' | cut -c1-150; }
timeout 200 ncu --clock-control none --metrics $M -k regex:"cluster_split_d_kernel" $F --B 1 --H 8 --N 8192 --D 1024 --variant 'cluster*' --iters 1 --warmup 0 2>&1 | show
timeout 100 ncu --clock-control none --metrics $M -k regex:"tma_split_d" $F --B 1 --H 8 --N 8192 --D 512 --variant 'tma-split-d+stage1' --iters 1 --warmup 0 2>&1 | show
