#!/usr/bin/env bash
# Session 21 (b: after a: no in-place writes of the accumulators, a drain of the MMAs where an accumulator's epilogue begins — ptxas had serialised every wgmma, C7514/C7515): rung 11's pass 1 with two staggered score accumulators per
# warpgroup (one's softmax and store under the other's MMAs; 128-key tiles,
# m64n128 wgmma). Variant tests, the new build against the landed one (HEAD,
# built beside it without torch) on the same GPU in the same call, ncu's per-
# pass time and tensor-pipe activity (session 20: pass 1 1.79 ms / 79 %), the
# benchmarks with the peers, the sanitizers, and cuBLAS's GEMM ceiling.
# Ran on the second version of the staggered pass 1 (the mask still applied
# on every tile); scripts/probes/next_rung11_staggered.patch holds the last one.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_with_head flash_attn_mma test_gpu_variants
echo "ptxas serialisation warnings (C75xx): $(nvcc -std=c++17 -arch=sm_90a -Xptxas -v -cubin -o /tmp/r11.cubin kernels/flash_attn/11_two_pass.cu -I kernels 2>&1 | grep -c C75)"
cuobjdump -sass /tmp/r11.cubin | awk '/Function :/{f=($0 ~ /scores_kernel.*ILi4EEE6__half/)} f' | grep -oE "HGMMA\.[0-9x]+|WARPGROUP\.[A-Z]+[^;]*" | sort | uniq -c
run_test 420 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed
show() { grep -E "two_pass|gpu__|sm__|lts__|l1tex__" | sed -E 's/\(CUtensorMap.*//; s/attnlab::\(anonymous namespace\):://g' | cut -c1-150; }
timeout 150 ncu --clock-control none --metrics $M -k regex:"two_pass" -c 2 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | show
el ncu
ab() {
  echo "new: $*"; timeout 60 $F "$@" --variant 'two-pass*' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-110
  [ -n "$FO" ] && { echo "old:"; timeout 60 $FO "$@" --variant 'two-pass*' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-110; }
}
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 1024 --causal
ab --B 1 --H 8 --N 8192 --D 512
ab --B 1 --H 8 --N 8192 --D 256
ab --B 1 --H 8 --N 8192 --D 1024
el ab
bench() { timeout 240 $F "$@" --sdpa --torch --check --show-all 2>&1 | grep -E "unfused|sdpa|cluster|two-pass|NVIDIA" | cut -c1-230; el "bench $*"; }
bench --B 1 --H 8 --N 8192 --D 1024
timeout 200 python3 scripts/probes/gemm_ceiling.py --D 1024 512
el gemm_ceiling
variant_sanitizers 'two-pass+stage4'
variant_sanitizers 'two-pass+stage2'
el done
