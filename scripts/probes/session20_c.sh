#!/usr/bin/env bash
# Session 20: rung 11 with pass 1's P̃ staged in shared memory and stored by
# TMA (was: 64 scattered 4-byte stores per thread and tile), pass 2 launched
# with programmatic stream serialization. Variant tests, ncu's per-pass time
# and tensor-pipe activity (session20_b: pass 1 2.16 ms / 60 %, pass 2 1.57 ms
# / 92 %), the benchmarks and the sanitizers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
run_test 420 test_gpu_variants 'two-pass*'
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
show() { grep -E "two_pass|gpu__|sm__|lts__|dram__" | sed -E 's/\(CUtensorMap.*//; s/attnlab::\(anonymous namespace\):://g' | cut -c1-150; }
timeout 150 ncu --clock-control none --metrics $M -k regex:"two_pass" -c 2 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | show
el ncu
ab() { timeout 60 $F "$@" --variant 'two-pass*' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-120; }
ab --B 1 --H 8 --N 8192 --D 1024
ab --B 1 --H 8 --N 8192 --D 1024
bench() { timeout 240 $F "$@" --sdpa --torch --check --show-all 2>&1 | grep -E "unfused|sdpa|cluster|two-pass|tma-split|NVIDIA" | cut -c1-230; el "bench $*"; }
bench --B 1 --H 8 --N 8192 --D 1024
bench --B 1 --H 8 --N 8192 --D 1024 --causal --variant 'two-pass*'
bench --B 1 --H 8 --N 8192 --D 512
variant_sanitizers 'two-pass+stage4'
variant_sanitizers 'two-pass+stage2'
el done
