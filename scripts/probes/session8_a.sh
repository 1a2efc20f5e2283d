#!/usr/bin/env bash
# (Runs against commit 25d9ef6: --dma-mask-scan streamed was reverted with it.)
# Session 8: the streamed in-kernel mask scan (DmaMaskScan::kStreamed) —
# test_dmattn (its new streamed cases), memcheck and racecheck on a streamed
# shape, then the call times it is for: the all-ones + bias forward at D=64
# and 128 against in-kernel and the pre-pass, and the top-1024 shapes where
# auto picks in-kernel (L = 8K, 16K), to decide the automatic rule.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
S="--B 1 --H 2 --Nq 200 --Nk 1040 --D 64 --mask ones --bias --dma-mask-scan streamed --iters 1 --warmup 0 --check"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F $S > $L/$tool.log 2>&1
  el "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log) $(grep -cE ' PASS' $L/$tool.log) PASS"
done
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 --Nq 300 --Nk 2048 --D 128 --causal --mask topk --window 256 --bias --dma-mask-scan streamed --iters 1 --warmup 0 --check > $L/race2.log 2>&1
el "racecheck topk D=128 rc=$? $(grep -E 'RACECHECK SUMMARY' $L/race2.log)"
A="--B 1 --H 8 --N 8192"
for D in 64 128; do
  for s in streamed in-kernel prepass; do echo "D=$D ones+bias $s: $(dm_time $A --D $D --mask ones --bias --dma-mask-scan $s)"; done
  echo "D=$D ones streamed: $(dm_time $A --D $D --mask ones --dma-mask-scan streamed)"
done
for N in 8192 16384; do
  T="--B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias"
  for s in streamed in-kernel; do echo "topk L=$N $s: $(dm_time $T --dma-mask-scan $s)"; done
done
T="--B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 8192 --bias"
for s in streamed in-kernel; do echo "topk W=8192 L=16K $s: $(dm_time $T --dma-mask-scan $s)"; done
el done
