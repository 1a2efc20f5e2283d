#!/usr/bin/env bash
# Session 12, second change: the dmattn backward's Q and dO tiles by TMA (one
# thread, 2·D/64 boxes onto the slot's mbarrier) instead of cp.async copies
# from every thread. A/B against the tree before it: this tree with
# build-old-src/dmattn_bwd.cu (the committed file; pass carry: build-old-src).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
OLD=/tmp/old_tree
mkdir -p $OLD && for f in *; do case $f in build*) ;; *) cp -r "$f" $OLD/ ;; esac; done &&
  cp build-old-src/dmattn_bwd.cu $OLD/kernels/dmattn/  # (no rsync on the device)
( tp=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
  cmake -S $OLD -B $OLD/build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$tp" > $L/old_build.log 2>&1 &&
  cmake --build $OLD/build-gpu -j ${OLD_JOBS:-8} --target flash_attn_mma >> $L/old_build.log 2>&1 || echo "OLD BUILD FAILED" ) &
old_pid=$!
probe_build flash_attn_mma test_dmattn_backward
wait $old_pid; el "old built"; FO=$OLD/build-gpu/flash_attn_mma
run_test 300 test_dmattn_backward
bwd_sanitizers
for rep in 1 2; do
  bwd_ab_shapes
done
bwd_ab "deterministic D=128" $BWD_DENSE --D 128 --deterministic
el "A/B done"
bwd_peers $BWD_DENSE --D 128
bwd_peers $BWD_DENSE --D 64
for s in "--B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 777 --D 128 --causal --mask topk --window 100 --bias" \
         "--B 1 --H 2 --Nq 129 --Nk 1000 --D 64 --mask topk --window 64 --bias --dtype bf16"; do
  echo "check $s: $(timeout 60 $F $s --bwd --check --iters 2 --warmup 1 2>&1 | grep -E 'dmattn bwd:' | grep -oE 'PASS|FAIL' | head -1)"
done
el done
