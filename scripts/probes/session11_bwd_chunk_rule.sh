#!/usr/bin/env bash
# Session 11: the backward's automatic query-chunk count with a mask — 32
# slots per block once the key tiles alone give every SM a block (16 before,
# still 16 below that). Predicted from session10_bwd_chunks.txt (8390bcb):
# all-active D=128 8 -> 4 chunks, 3.33 -> ~3.24 ms (~+3%); D=64 8 -> 4,
# 2.02 -> ~1.97; L=16K top-1024 32 -> 16, 0.186 -> ~0.179; L=8192 and 32K
# unchanged (16). One call: tests first (the review commit f9e5001 touched the
# kernel after the last GPU run), then a same-run A/B (the new automatic count
# against the old one forced with --bwd-chunks, alternating, twice), then the
# torch peers at the same shapes, then the backward's sanitizers.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward
run_test 120 test_dmattn_backward
bw() { timeout 60 $F "$@" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd:" | cut -c1-110; }
dense="--B 1 --H 8 --N 8192 --mask ones --bias"
sparse="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"
for rep in 1 2; do
  for D in 128 64; do
    echo "all-active D=$D auto: $(bw $dense --D $D)"
    echo "all-active D=$D old 8: $(bw $dense --D $D --bwd-chunks 8)"
  done
  echo "top-1024 L=16384 auto: $(bw $sparse --N 16384)"
  echo "top-1024 L=16384 old 32: $(bw $sparse --N 16384 --bwd-chunks 32)"
done
for N in 8192 32768; do echo "top-1024 L=$N auto (unchanged): $(bw $sparse --N $N)"; done
el "A/B done"
peers() { timeout 90 $F "$@" --bwd --torch --sdpa --iters 10 --warmup 2 2>&1 | grep -E "bwd:" | cut -c1-120; }
peers $dense --D 128
peers $sparse --N 16384
el "peers done"
bwd_sanitizers
el done
