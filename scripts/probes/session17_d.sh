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
{ cmake -S . -B build-gpu-b -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF \
    "-DCMAKE_CUDA_FLAGS=-DATTNLAB_R10_PUSH_FULL_ACQUIRE=1" &&
  cmake --build build-gpu-b -j 6 --target flash_attn_mma; } > $L/build_b.log 2>&1 &
pb=$!
probe_build flash_attn_mma test_gpu_variants
wait $pb || { tail -30 $L/build_b.log; exit 1; }
el "built both"
FB=build-gpu-b/flash_attn_mma
for d in "$B" build-gpu-b; do
  o=$(find $d -name '10_cluster_split_d.cu.o' | head -1)
  echo "$d: CCTL.IVALL $(cuobjdump -sass $o | grep -c 'CCTL.IVALL'), FENCE $(cuobjdump -sass $o | grep -c 'FENCE'), MEMBAR $(cuobjdump -sass $o | grep -c 'MEMBAR')"
done
run_test 300 test_gpu_variants 'cluster*'
V='cluster-split-d+stage1+push'
for tool in memcheck racecheck racecheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
    --variant "$V" --iters 1 --warmup 0 --check > $L/san.log 2>&1; rc=$?
  el "$V $tool rc=$rc $(grep -E 'SUMMARY' $L/san.log) $(grep -c FAIL $L/san.log) FAIL"
  [ $rc != 0 ] && { grep -v "^=========     " $L/san.log | grep -E "=========|FAIL|rror" | head -12 | cut -c1-200; }
done
row() { timeout 100 "$1" --B 1 --H 8 --N 8192 --D 1024 "${@:2}" --variant "$V" --iters 10 --warmup 2 --show-all 2>&1 | grep -E "push" | cut -c1-110; }
for rep in 1 2; do
  echo "old: $(row $FB)"; echo "new: $(row $F)"
done
echo "causal old: $(row $FB --causal)"; echo "causal new: $(row $F --causal)"
el done
