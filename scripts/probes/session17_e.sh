#!/usr/bin/env bash
# (Runs on 4e97227 with scripts/probes/next_dmattn_streamed_scan_tma.patch applied: the macro it names is in the patch.)
# Session 17: the dynamic-mask forward's streamed mask scan (wgmma core,
# in-kernel scan, one split): the mask rows of two key tiles at a time by one
# TMA box copy into 8 KiB of shared memory while the block computes, reduced
# to bits a few tiles ahead; the first segment not all active ends it (word
# scan of the rest). A: this tree; B: -DATTNLAB_DMA_NO_STREAMED_SCAN=1 (the
# tree before). test_dmattn and sanitizers on A, then B and A alternating,
# twice.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_ab "-DATTNLAB_DMA_NO_STREAMED_SCAN=1" flash_attn_mma test_dmattn
C="--iters 1 --warmup 0 --check"
for s in "--B 1 --H 2 --Nq 130 --Nk 1040 --D 64 --mask ones --bias" \
         "--B 1 --H 2 --Nq 200 --Nk 1024 --D 128 --Hkv 1 --causal --mask topk --window 500 --bias --dma-mask-scan in-kernel" \
         "--B 2 --H 2 --Nq 300 --Nk 2048 --D 64 --mask topk --window 1000 --block 0 --bias --dma-mask-scan in-kernel"; do
  echo "A $s: $($F $s $C 2>&1 | grep -E '^ *dmattn:' | cut -c30-200)"
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F $s $C > $L/san.log 2>&1
    el "$tool rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' $L/san.log)"
  done
done
run_test 240 test_dmattn
FO=$FB  # dm_ab: "old" = B (streaming off), "new" = A (this tree)
for rep in 1 2; do
  dm_ab "ones+bias D=64" --B 1 --H 8 --N 8192 --D 64 --mask ones --bias
  dm_ab "ones+bias D=128" --B 1 --H 8 --N 8192 --D 128 --mask ones --bias
  dm_ab "ones+bias causal D=64" --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --causal
  dm_ab "top-1024 L=8K" --B 1 --H 2 --Hkv 1 --N 8192 --D 128 --causal --mask topk --window 1024 --bias
  dm_ab "top-1024 L=16K in-kernel" --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan in-kernel
done
timeout 60 $F --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --show-all --iters 20 --warmup 3 2>&1 | grep -E "^ *(dmattn|split-q)" | cut -c1-170
el done
