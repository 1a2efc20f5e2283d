#!/usr/bin/env bash
# One-off: ncu of rung 12's ping-pong kernel beside cuDNN's forward (B=1 H=8
# N=8192 fp16, D = 64, 128, 256): throughput, tensor pipe, occupancy, stalls.
set -uo pipefail
cd "$(dirname "$0")/.."
o=${OUT:-/tmp/ncu_out}; mkdir -p "$o"
T0=$SECONDS
cmake -S . -B build-ncu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=OFF > "$o/build.log" 2>&1 &&
  cmake --build build-ncu -j16 --target flash_attn_mma >> "$o/build.log" 2>&1 || { tail -20 "$o/build.log"; exit 1; }
echo "build: $((SECONDS - T0)) s"
metrics='regex:sm__pipe_tensor_op_.*cycles_active.avg.pct_of_peak_sustained_active|smsp__average_warp_latency_issue_stalled_.*_per_warp_active.ratio'
for D in 64 128 256; do
  timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --metrics "$metrics" -k 'regex:ws_kernel|cudnn' -c 2 \
    build-ncu/flash_attn_mma --B 1 --H 8 --N 8192 --D $D --variant 'ws+stage2+pingpong,sdpa(cudnn)' --sdpa \
    --iters 1 --warmup 0 > "$o/ncu_d$D.txt" 2>&1
  echo "D=$D: ncu rc=$? ($((SECONDS - T0)) s)"
  grep -E '^  [a-z_]+|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issued Warp Per|No Eligible|tensor_op.*pct|stalled_(long_scoreboard|barrier|wait|math|mio|short|membar|sleeping|dispatch|branch|lg|no_inst|not_selected|selected|tex|drain|imc|misc)' \
    "$o/ncu_d$D.txt" | sed 's/  */ /g' | cut -c1-150
done
