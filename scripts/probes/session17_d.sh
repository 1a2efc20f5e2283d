#!/usr/bin/env bash
# (Runs on 461d485 with scripts/probes/next_rung10_shared_acquire.patch applied: the macro it names is in the patch.)
# Session 17: rung 10's push waits (red_free, recv_full) acquiring for shared
# memory only — a relaxed try_wait and fence.acquire.sync_restrict::shared::
# cluster.cluster — instead of mbarrier.try_wait.acquire.cluster, whose L1
# invalidation (CCTL.IVALL) took ~4.5 % of the stall samples. A: this tree;
# B: -DATTNLAB_R10_PUSH_FULL_ACQUIRE=1 (the tree before). The SASS's
# CCTL.IVALL count in both, rung 10's variant tests and sanitizers on A, then
# B and A alternating, twice, at D = 1024 (and causal once).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build_ab "-DATTNLAB_R10_PUSH_FULL_ACQUIRE=1" flash_attn_mma test_gpu_variants
for d in "$B" build-gpu-b; do
  o=$(find $d -name '10_cluster_split_d.cu.o' | head -1)
  echo "$d: CCTL.IVALL $(cuobjdump -sass $o | grep -c 'CCTL.IVALL'), FENCE $(cuobjdump -sass $o | grep -c 'FENCE'), MEMBAR $(cuobjdump -sass $o | grep -c 'MEMBAR')"
done
run_test 300 test_gpu_variants 'cluster*'
V='cluster-split-d+stage1+push'
variant_sanitizers "$V"
row() { timeout 100 "$1" --B 1 --H 8 --N 8192 --D 1024 "${@:2}" --variant "$V" --iters 10 --warmup 2 --show-all 2>&1 | grep -E "push" | cut -c1-110; }
for rep in 1 2; do
  echo "old: $(row $FB)"; echo "new: $(row $F)"
done
echo "causal old: $(row $FB --causal)"; echo "causal new: $(row $F --causal)"
el done
