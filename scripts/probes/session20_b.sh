#!/usr/bin/env bash
# Session 20: rung 11's pass 2 with P̃ multicast to the Dv / 256 blocks of a
# row block (a cluster of 4 at Dv = 1024, 2 at 512) against no multicast
# (ATTNLAB_TWO_PASS_NO_MULTICAST=1), alternating in separate processes; ncu's
# per-kernel time, tensor-pipe activity, L2 and DRAM throughput of both passes;
# the variant tests and the sanitizers of the multicast path.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
run_test 420 test_gpu_variants 'two-pass*'
ab() { timeout 60 $F "$@" --variant 'two-pass*' --iters 20 --show-all 2>&1 | grep -E "^ *two-pass" | cut -c1-120; }
for i in 1 2; do
  el "multicast"; ab --B 1 --H 8 --N 8192 --D 1024
  el "no multicast"; ATTNLAB_TWO_PASS_NO_MULTICAST=1 ab --B 1 --H 8 --N 8192 --D 1024
done
el "D=512 multicast"; ab --B 1 --H 8 --N 8192 --D 512
el "D=512 no multicast"; ATTNLAB_TWO_PASS_NO_MULTICAST=1 ab --B 1 --H 8 --N 8192 --D 512
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
show() { grep -E "two_pass|gpu__|sm__|lts__|dram__" | sed -E 's/\(CUtensorMap.*//; s/attnlab::\(anonymous namespace\):://g' | cut -c1-150; }
el "ncu multicast"
timeout 150 ncu --clock-control none --metrics $M -k regex:"two_pass" -c 4 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | show
el "ncu no multicast"
ATTNLAB_TWO_PASS_NO_MULTICAST=1 timeout 150 ncu --clock-control none --metrics $M -k regex:"two_pass_output" -c 2 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 1 --warmup 0 2>&1 | show
variant_sanitizers 'two-pass+stage4'
el done
