#!/usr/bin/env bash
# Session 10: the backward's query-chunk count (--bwd-chunks) on the
# all-active shape (automatic: 8 at N = 8192, one per 16 slots of a key tile)
# and on the sparse training shapes (automatic: 32 at 16K, 16 at 32K).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
bw() { timeout 60 $F "$@" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd:" | cut -c1-100; }
[ -z "${BWD_CHUNKS_RULE:-}" ] && for D in 128 64; do for c in 1 2 4 8 16; do
  echo "all-active D=$D chunks $c: $(bw --B 1 --H 8 --N 8192 --D $D --mask ones --bias --bwd-chunks $c)"; done; done
[ -z "${BWD_CHUNKS_RULE:-}" ] && for N in 16384 32768; do for c in 4 8 16 32 64; do
  echo "top-1024 L=$N chunks $c: $(bw --B 1 --H 2 --Hkv 1 --N $N --D 128 --causal --mask topk --window 1024 --bias --bwd-chunks $c)"; done; done
# Second run (BWD_CHUNKS_RULE=1): the training shape's shorter rows under the old rule (one chunk per 16
# slots of a key tile) and the proposed one (per 32), twice each.
if [ -n "${BWD_CHUNKS_RULE:-}" ]; then
  for L in 1024 2048 4096 8192; do for rep in 1 2; do for c in $((L / 512)) $((L / 1024)); do
    echo "top-1024 L=$L chunks $c: $(bw --B 1 --H 2 --Hkv 1 --N $L --D 128 --causal --mask topk --window 1024 --bias --bwd-chunks $c)"
  done; done; done
fi
el done
