#!/usr/bin/env bash
# For the next session (written in session 13, not yet run): is the all-active
# backward at D = 64 (0.86x FA2's backward) and D = 128 (0.97x) bound by L2
# traffic — each 64-key block loads every (query tile, head) slot's Q and dO
# (16 KiB at D = 64) and reduces its dQ tile into fp32 (another 16 KiB of L2
# reductions), where FA2 walks 128 keys per block and moves half of both? ncu
# on the backward kernel alone (the plan decides one chunk): L2 throughput and
# its reduction sectors, DRAM, tensor pipe, issue stalls; the same for FA2's
# backward kernel in the same process (the sdpa(flash) bwd peer row) as the
# yardstick. Both at N = 4096 (a quarter of the benchmark's work, same tiles).
cd "$(dirname "$0")/../.." && . scripts/probes/common.sh
probe_build flash_attn_mma
M="--clock-control none --metrics gpu__time_duration.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_atom.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio"
n() { timeout 200 ncu --clock-control none $M -k regex:"$1" --launch-count 1 $F "${@:2}" --iters 1 --warmup 0 2>&1 | grep -E "^  [a-zA-Z_].*\(|gpu__|lts__|dram__|sm__|smsp__" | cut -c1-130; }
for D in 64 128; do
  echo "== dmattn backward kernel, all-ones + bias, N=4096 D=$D"; n dma_bwd_kernel --B 1 --H 8 --N 4096 --D $D --mask ones --bias --bwd
  echo "== FA2's backward (its main kernel, flash_bwd_dq_dk_dv_*), same Q, K, V, dO, no mask, D=$D"
  n "flash_bwd_dq_dk_dv" --B 1 --H 8 --N 4096 --D $D --mask ones --bias --bwd --sdpa
done
for D in 128 64; do bwd_peers $BWD_DENSE --D $D; done
el done
