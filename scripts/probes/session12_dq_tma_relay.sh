#!/usr/bin/env bash
# Session 12, from the ncu PC-sampling profile (session12_profile.sh):
#  - dmattn backward: dQ added by TMA tensor reductions (4 boxes of 64 x 32
#    fp32 at D = 128, 2 at D = 64, one thread) instead of one bulk reduction
#    per row from 64 threads (D = 128; the lanes' issues are serialised) or
#    atomics (D = 64); the reductions' read wait moved to the next tile's
#    first barrier and the tile's closing barrier dropped. The profile put
#    ~27 % of the warps' stall samples in that epilogue.
#  - rung 10 +push: the readers of the partner's Σ arrive on a block-local
#    mbarrier and one producer-warpgroup thread sends the cluster-scope
#    release (the per-thread release.cluster fences were ~14 % of the compute
#    warps' samples).
# One call: the old tree (git HEAD) and this tree built side by side; tests
# and sanitizers on the new one; a same-run A/B alternating old/new; peers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
OLD=/tmp/old
git worktree add -f $OLD HEAD > /dev/null 2>&1 || [ -e $OLD/CMakeLists.txt ] || { echo "worktree failed"; exit 1; }
( tp=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
  cmake -S $OLD -B $OLD/build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$tp" > $L/old_build.log 2>&1 &&
  cmake --build $OLD/build-gpu -j 8 --target flash_attn_mma >> $L/old_build.log 2>&1 || echo "OLD BUILD FAILED" ) &
old_pid=$!  # (a bare `wait` would also wait for common.sh's tee: the first run hung there)
probe_build flash_attn_mma test_dmattn_backward test_gpu_variants
wait $old_pid; el "old built"; FO=$OLD/build-gpu/flash_attn_mma
run_test 300 test_dmattn_backward
run_test 300 test_gpu_variants 'cluster*'
bwd_sanitizers
for i in 1 2 3 4 5 6; do
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
    --variant 'cluster*' --iters 1 --warmup 0 --check > $L/race$i.log 2>&1; rc=$?
  el "rung 10 racecheck $i rc=$rc $(grep -E 'RACECHECK SUMMARY' $L/race$i.log) $(grep -c FAIL $L/race$i.log) FAIL"
  [ $rc != 0 ] && { grep -v "^=========     " $L/race$i.log | grep -E "=========|FAIL|rror" | head -12 | cut -c1-200; cp $L/race$i.log $O/; }
done
for tool in memcheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
    --variant 'cluster*' --iters 1 --warmup 0 --check > $L/san.log 2>&1
  el "rung 10 $tool rc=$? $(grep -E 'SUMMARY' $L/san.log) $(grep -c FAIL $L/san.log) FAIL"
done
r10() { timeout 120 $1 --B 1 --H 8 --N 8192 --D 1024 --variant 'cluster-split-d+stage1+push' --iters 10 --warmup 2 "${@:2}" 2>&1 | grep -E "cluster" | cut -c1-110; }
for rep in 1 2; do
  bwd_ab_shapes
  echo "rung 10 old: $(r10 $FO)"
  echo "rung 10 new: $(r10 $F)"
done
echo "rung 10 causal old: $(r10 $FO --causal)"
echo "rung 10 causal new: $(r10 $F --causal)"
el "A/B done"
bwd_peers $BWD_DENSE --D 128
bwd_peers $BWD_DENSE --D 64
timeout 200 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'cluster*' --torch --sdpa --check --iters 10 --warmup 2 > $L/r10peers.txt 2>&1
grep -E "cluster|unfused|efficient|cudnn|rel" $L/r10peers.txt | cut -c1-150
el done
