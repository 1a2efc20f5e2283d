#!/usr/bin/env bash
# Session 23 (d): does the early-chunk gain hold under a sustained load? Rung
# 11 +stage4 at 4f0dfc2 (before) against HEAD (early chunks) and HEAD with
# ATTNLAB_TWO_PASS_NO_EARLY_MMA=1, 200 timed runs each, alternating three
# times, at D = 1024, then D = 1024 causal and D = 512.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
mkdir -p /tmp/before && git archive 4f0dfc2 | tar -x -C /tmp/before && (
  cmake -S /tmp/before -B /tmp/before/b -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF &&
  cmake --build /tmp/before/b -j 8 --target flash_attn_mma) > $L/build_before.log 2>&1 & pb=$!
{ cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF &&
  cmake --build $B -j 8 --target flash_attn_mma; } > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
wait $pb || { tail -20 $L/build_before.log; exit 1; }
FP=/tmp/before/b/flash_attn_mma
el built
row() { timeout 120 env "${@:3}" $2 $SHAPE --variant two-pass+stage4 --iters $1 --warmup 20 2>&1 | grep -E "^ *two-pass" | sed -E 's/\[.*\], //' | cut -c1-80; }
sus() {
  SHAPE="$*"
  echo "== $* (200 runs each)"
  for r in 1 2 3; do
    echo "before:   $(row 200 $FP X=0)"
    echo "early:    $(row 200 $F X=0)"
    echo "no-early: $(row 200 $F ATTNLAB_TWO_PASS_NO_EARLY_MMA=1)"
  done
}
sus --B 1 --H 8 --N 8192 --D 1024
sus --B 1 --H 8 --N 8192 --D 1024 --causal
sus --B 1 --H 8 --N 8192 --D 512
el done
