#!/usr/bin/env bash
# Next session: why the all-ones + bias forward at D=64 runs at 0.70x the dense
# split-q rung (0.671 vs 0.468 ms, 44f1a1c) while D=128 reaches 0.94x. ncu, one
# launch each, at the card's clocks: the dmattn forward kernel (in-kernel scan,
# and with the plain pre-pass so the kernel alone is measured), rung 02 and
# rung 07 at D=64 on the same shape: time, tensor-pipe share, occupancy,
# registers, the top stall reasons.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
A="--B 1 --H 8 --N 8192 --D 64"
M="--clock-control none --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__inst_executed.sum"
n() { timeout 120 ncu --clock-control none $M -k regex:"$1" --launch-skip 1 --launch-count 1 $F "${@:2}" --iters 1 --warmup 1 2>&1 | grep -E "^  [a-zA-Z_].*\(|gpu__|sm__|launch__|smsp__" | cut -c1-120; }
echo "== dmattn forward, all-ones + bias, D=64, plain pre-pass"; n dma_forward_kernel $A --mask ones --bias --dma-mask-scan prepass
echo "== dmattn forward, all-ones, no bias"; n dma_forward_kernel $A --mask ones --dma-mask-scan prepass
echo "== rung 02 split-q+stage2"; n split_q $A --variant 'split-q+stage2'
echo "== rung 07 wgmma+stage2+overlap"; n wgmma $A --variant 'wgmma+stage2+overlap'
echo "== mask summary pre-pass kernel"; n mask_summary_kernel $A --mask ones --bias --dma-mask-scan prepass
echo "== call times (ms TFLOPS)"
for s in in-kernel prepass pipelined; do echo "ones+bias $s: $(dm_time $A --mask ones --bias --dma-mask-scan $s)"; done
echo "ones, no bias: $(dm_time $A --mask ones)"
echo "no mask, bias: $(dm_time $A --mask none --bias)"
echo "no mask, no bias: $(dm_time $A --mask none)"
echo "D=128 ones+bias: $(dm_time --B 1 --H 8 --N 8192 --D 128 --mask ones --bias)"
echo "D=128 no mask, bias: $(dm_time --B 1 --H 8 --N 8192 --D 128 --mask none --bias)"
el done
