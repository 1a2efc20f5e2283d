#!/usr/bin/env bash
# Ran in session 15 with the patch applied: correct, half the L2 sectors,
# 17-24 % slower (results/H200/probes/session15_bwd_paired.txt); the patch
# was reverted and this script needs it (git am -3 next_bwd_paired.patch).
# For the next session (written in session 14 without a GPU; compile-checked
# for sm_80 / sm_90a: 247 registers at D = 128, 243 at D = 64, no spills;
# 149 504 / 83 968 bytes of shared memory, one block of 8 warps per SM):
# the backward's paired key tiles (--bwd-paired,
# DmaBackwardArgs::paired_key_tiles) — two warpgroups on 128 keys sharing
# every Q/dO slot, dQ of the two 64-key sub-tiles summed in shared memory
# before one set of TMA reductions. Hypothesis (ncu, session 14): ours reads
# 2.7x and reduces 2.15x FA2's L2 sectors per call; pairing halves both per
# key. Tests (test_dmattn_backward: a paired selection per dtype x causal,
# Nk = 60 / 77 / 130 / 200 / 1000 for partial pairs), sanitizers and --check
# on paired shapes, then paired against not, alternating, twice; FA2's
# backward in the same run; ncu's L2 sectors of the paired kernel.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
if [ -n "${TESTS_LOG:-}" ]; then cp "$TESTS_LOG" $L/test_dmattn_backward.log; el "test_dmattn_backward (gpu_check's run): $(tail -1 $L/test_dmattn_backward.log)"
else run_test 240 test_dmattn_backward; fi
echo "paired cases: $(grep -c 'paired key tiles' $L/test_dmattn_backward.log) lines naming them"
C="--iters 1 --warmup 0 --check"
for s in "--B 1 --H 2 --Nq 200 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 64 --bias" \
         "--B 1 --H 2 --Nq 70 --Nk 190 --D 64 --mask ones --bias" \
         "--B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 777 --D 128 --causal --mask topk --window 400 --bias --dtype bf16" \
         "--B 1 --H 2 --Nq 129 --Nk 60 --D 64 --causal --bias"; do
  echo "paired $s: $($F $s --bwd --bwd-paired $C 2>&1 | grep -E 'dmattn bwd:' | cut -c30-150)"
done
for s in "--Nq 200 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 64 --bias" "--Nq 70 --Nk 190 --D 64 --mask ones --bias"; do
  for tool in racecheck memcheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 $s --bwd --bwd-paired $C > $L/san.log 2>&1
    el "$tool (paired) $s rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' $L/san.log)"
  done
done
for rep in 1 2; do
  for D in 128 64; do
    echo "all-active D=$D:          $(bwd_row $F $BWD_DENSE --D $D)"
    echo "all-active D=$D paired:   $(bwd_row $F $BWD_DENSE --D $D --bwd-paired)"
  done
  echo "all-active causal D=128:        $(bwd_row $F $BWD_DENSE --D 128 --causal)"
  echo "all-active causal D=128 paired: $(bwd_row $F $BWD_DENSE --D 128 --causal --bwd-paired)"
  echo "top-1024 L=16K:        $(bwd_row $F $BWD_SPARSE --N 16384)"
  echo "top-1024 L=16K paired: $(bwd_row $F $BWD_SPARSE --N 16384 --bwd-paired)"
done
for D in 128 64; do bwd_peers $BWD_DENSE --D $D --bwd-paired; done
M="--clock-control none --metrics gpu__time_duration.sum,launch__registers_per_thread,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
for D in 128 64; do
  echo "== ncu paired D=$D (N=4096)"
  timeout 120 ncu --clock-control none $M -k regex:dma_bwd_kernel --launch-count 1 $F --B 1 --H 8 --N 4096 --D $D --mask ones --bias --bwd --bwd-paired \
    --iters 1 --warmup 0 2>&1 | grep -E "gpu__|lts__|sm__|launch__" | cut -c1-130
done
el done
