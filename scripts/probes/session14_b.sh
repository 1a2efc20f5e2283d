#!/usr/bin/env bash
# Session 14, second device call (ran at 0a184c0, where the switch existed): the backward's wgmma kernel at D = 64 with
# three blocks per SM (DmaBackwardArgs::d64_variant; --bwd-d64-variant N):
# 0 = two blocks per SM, one 64-query slice (229 registers, the default);
# 1 = three blocks, two 32-query slices (168 registers, no spills);
# 2 = three blocks, one slice (168 registers, 60 bytes spilled).
# Hypothesis: the D = 64 backward waits on its dependent wgmmas at 8 warps
# per SM (session 12's profile); 12 warps hide more of it.
# --check of each variant on ragged, causal, GQA, softcap, bf16 shapes and
# the sanitizers on one; then the variants alternating, twice, on the
# all-active (D = 64, + causal) and a top-1024 D = 64 shape; FA2's backward
# in the same run; then ncu (session 13's next_bwd_l2.sh metrics + occupancy)
# of our kernel (variants 0, 1) against FA2's at D = 64 and 128, N = 4096.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
C="--iters 1 --warmup 0 --check"
for v in 1 2; do
  for s in "--B 2 --H 4 --Hkv 2 --Nq 129 --Nk 200 --causal --mask topk --window 48 --bias" \
           "--B 1 --H 2 --Nq 1000 --Nk 1000 --mask ones --bias --dtype bf16" \
           "--B 1 --H 3 --Hkv 1 --Nq 127 --Nk 17 --mask topk --window 8 --bias --softcap 15" \
           "--B 1 --H 2 --Nq 1 --Nk 300 --causal --mask topk --window 64 --bias --dtype bf16" \
           "--B 1 --H 2 --Nq 300 --Nk 129 --causal --bias" \
           "--B 3 --H 4 --Nq 2100 --Nk 2200 --mask ones --bias"; do
    echo "v$v $s: $($F --D 64 $s --bwd --bwd-d64-variant $v $C 2>&1 | grep -E 'dmattn bwd:' | cut -c30-140)"
  done
done
S="--B 1 --H 2 --Nq 70 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 32 --bias --bwd --bwd-d64-variant 1 $C"
for tool in racecheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F $S > $L/san.log 2>&1
  el "$tool (variant 1) rc=$? $(grep -E 'SUMMARY' $L/san.log)"
done
SP64="--B 1 --H 2 --Hkv 1 --D 64 --causal --mask topk --window 1024 --bias --N 16384"
for rep in 1 2; do
  for v in 0 1 2; do
    echo "all-active D=64 v$v:        $(bwd_row $F $BWD_DENSE --D 64 --bwd-d64-variant $v)"
    echo "all-active causal D=64 v$v: $(bwd_row $F $BWD_DENSE --D 64 --causal --bwd-d64-variant $v)"
    echo "top-1024 L=16K D=64 v$v:    $(bwd_row $F $SP64 --bwd-d64-variant $v)"
  done
done
el "A/B done"
bwd_peers $BWD_DENSE --D 64 --bwd-d64-variant 1
M="--clock-control none --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio"
n() { timeout 120 ncu --clock-control none $M -k regex:"$1" --launch-count 1 $F "${@:2}" --iters 1 --warmup 0 2>&1 | grep -E "^  [a-zA-Z_].*\(|gpu__|lts__|dram__|sm__|smsp__|launch__" | cut -c1-130; }
A4="--B 1 --H 8 --N 4096 --mask ones --bias --bwd"
echo "== ours D=64 v0"; n dma_bwd_kernel $A4 --D 64
echo "== ours D=64 v1"; n dma_bwd_kernel $A4 --D 64 --bwd-d64-variant 1
echo "== FA2 D=64";     n flash_bwd_dq_dk_dv $A4 --D 64 --sdpa
echo "== ours D=128";   n dma_bwd_kernel $A4 --D 128
echo "== FA2 D=128";    n flash_bwd_dq_dk_dv $A4 --D 128 --sdpa
el done
