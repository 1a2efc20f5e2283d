#!/usr/bin/env bash
# Session-5 probe C: the in-kernel mask scan with the longest scans first
# (no zigzag), against the pre-pass, over L and heads; tests once more.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 300 test_dmattn
for H in 2 8; do
  for N in 8192 16384 32768; do
    D="--B 1 --H $H --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias"
    echo "H=$H L=$N  in-kernel $(dm_time $D --dma-mask-scan in-kernel) | prepass $(dm_time $D --dma-mask-scan prepass) | in-kernel $(dm_time $D --dma-mask-scan in-kernel)"
  done
done
D="--B 1 --H 2 --Hkv 1 --N 32768 --D 64 --causal --mask topk --window 1024 --bias"
echo "D=64 H=2 L=32K in-kernel $(dm_time $D --dma-mask-scan in-kernel) | prepass $(dm_time $D --dma-mask-scan prepass)"
D="--B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-core mma"
echo "mma H=2 L=32K in-kernel $(dm_time $D --dma-mask-scan in-kernel) | prepass $(dm_time $D --dma-mask-scan prepass)"
$F --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --sdpa --iters 5 --warmup 1 2>&1 | grep -E "^ *(dmattn|sdpa|torch)" | cut -c1-150
for d in 128 64; do
  D="--B 1 --H 8 --N 8192 --D $d --mask ones --bias"
  echo "all-ones D=$d H=8 in-kernel $(dm_time $D --dma-mask-scan in-kernel) | prepass $(dm_time $D --dma-mask-scan prepass)"
  D="--B 1 --H 8 --N 8192 --D $d --mask ones --bias --causal"
  echo "all-ones causal D=$d H=8 in-kernel $(dm_time $D --dma-mask-scan in-kernel) | prepass $(dm_time $D --dma-mask-scan prepass)"
done
D="--B 1 --H 32 --Hkv 8 --N 4096 --D 128 --causal --mask topk --window 512 --bias"
echo "H=32 L=4K in-kernel $(dm_time $D --dma-mask-scan in-kernel) | prepass $(dm_time $D --dma-mask-scan prepass)"
el done
tar czf $O/logs.tgz -C /tmp logs
