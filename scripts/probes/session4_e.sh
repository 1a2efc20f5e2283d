#!/usr/bin/env bash
# Session-4 probe E (copy of D: TMA + rescale skip): the wgmma forward with one barrier per tile; where the
# time of the L=32K forward goes (pre-pass vs forward kernel).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn
run_test 240 test_dmattn
row() { echo "== $*"; timeout 90 $F --B 1 "$@" --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|split-q|sdpa|torch)|error" | cut -c1-210; }
for D in 128 64; do
  row --H 8 --N 8192 --D $D --mask ones --bias
  row --H 8 --N 8192 --D $D --mask ones --bias --dma-core wgmma-cp.async | grep dmattn
  row --H 8 --N 8192 --D $D --mask ones --bias --dma-core mma | grep dmattn
done
row --H 8 --N 8192 --D 128 --mask ones --bias --dtype bf16
row --H 8 --N 8192 --D 128 --mask ones
row --H 8 --N 8192 --D 128 --mask ones --bias --causal
row --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias
el fwd
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:"mask_summary|dma_forward_kernel" --launch-count 2 $F --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --iters 1 --warmup 0 2>&1 | grep -E "^  [a-z_]+.*\(|gpu__time" | cut -c1-120
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum,sm__cycles_active.avg,smsp__warps_launched.sum -k regex:"dma_forward_kernel" --launch-count 1 $F --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --iters 1 --warmup 0 2>&1 | grep -E "gpu__time|sm__cyc|warps_l" | cut -c1-120
el ncu
tar czf $O/logs.tgz -C /tmp logs
