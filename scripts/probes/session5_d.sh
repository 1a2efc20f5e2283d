#!/usr/bin/env bash
# Session-5 probe D: where the L = 32K forward's time goes (pre-pass kernel
# and forward kernel, ncu at the card's own clocks), pre-pass against
# in-kernel scan.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
D="--B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --iters 1 --warmup 0"
for s in prepass in-kernel; do
  skip=2; [ $s = in-kernel ] && skip=1
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_shared_mem -k regex:"mask_summary|dma_forward_kernel" --launch-skip $skip --launch-count $skip $F $D --dma-mask-scan $s > $L/ncu_$s.txt 2>&1
  el "$s rc=$?"; grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__bytes|warps_active|inst_executed|registers|occupancy" $L/ncu_$s.txt | cut -c1-110
done
timeout 120 ncu --clock-control none --section WarpStateStats --section SchedulerStats --section Occupancy -k regex:"dma_forward_kernel" --launch-skip 1 --launch-count 1 $F $D --dma-mask-scan prepass > $L/ncu_fwd_stalls.txt 2>&1
grep -E "Stall|Warp Cycles|Eligible|Issued Warp|No Eligible|Active Warps|Achieved Occ|Theoretical Occ" $L/ncu_fwd_stalls.txt | cut -c1-110
el done
tar czf $O/logs.tgz -C /tmp logs
