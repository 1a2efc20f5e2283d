#!/usr/bin/env bash
# Profile the dynamic-mask forward on an all-ones mask + bias against the dense
# split-q+stage2 rung (same shape), and the decoding path: ncu sections for
# where the time goes (stall reasons, occupancy, throughput).
cd "$(dirname "$0")/../.."
B=${BUILD_DIR:-build-gpu}
cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build $B -j 16 > ${OUT:-.}/build.txt 2>&1 || exit 1
F=$B/flash_attn_mma
timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
  --section MemoryWorkloadAnalysis -k regex:"dma_forward_kernel|split_q_kernel" --launch-count 2 \
  $F --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --iters 1 --warmup 0 > ${OUT:-.}/ncu_fwd.txt 2>&1
grep -E "^  [a-z]|Duration|Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Warp|Block Limit|L2 Hit|Mem Busy|Max Bandwidth|Bank" ${OUT:-.}/ncu_fwd.txt | cut -c1-150
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:"mask_summary|dma_forward_kernel|dma_combine" --launch-count 3 \
  $F --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 32768 --D 128 --causal --mask topk --window 1024 --block 0 --bias --iters 1 --warmup 0 2>&1 |
  grep -E "^  [a-z]|gpu__time" | cut -c1-120
