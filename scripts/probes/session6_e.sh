#!/usr/bin/env bash
# Session-6 probe E: probe D hung — mask_scan::all_bits (warp ballots) was
# called by lane 0 only in the streamed pre-pass. Fixed; tests and the rows.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_summary
timeout 60 $B/test_dmattn_summary > $L/summary_tests.log 2>&1; el "test_dmattn_summary rc=$? $(tail -1 $L/summary_tests.log)"; grep -m6 FAIL $L/summary_tests.log | cut -c1-240
t() { timeout 20 $F "$@" --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn|rror" | sed -E 's/ +dmattn: time:/ /; s/, effective TFLOPS:/ ms /' | cut -c1-40; }
T="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --bias"
echo "L=32K W=1024: prepass $(t $T --N 32768 --window 1024 --dma-mask-scan prepass) | streamed $(t $T --N 32768 --window 1024 --dma-mask-scan streamed) | streamed $(t $T --N 32768 --window 1024 --dma-mask-scan streamed)"
echo "L=32K W=32: streamed $(t $T --N 32768 --window 32 --dma-mask-scan streamed)  W=2048 streamed $(t $T --N 32768 --window 2048 --dma-mask-scan streamed)"
echo "L=16K: streamed $(t $T --N 16384 --window 1024 --dma-mask-scan streamed) | in-kernel $(t $T --N 16384 --window 1024 --dma-mask-scan in-kernel)"
echo "H=8 L=32K: prepass $(t --B 1 --H 8 --Hkv 1 --D 128 --causal --mask topk --bias --window 1024 --N 32768 --dma-mask-scan prepass) | streamed $(t --B 1 --H 8 --Hkv 1 --D 128 --causal --mask topk --bias --window 1024 --N 32768 --dma-mask-scan streamed)"
echo "all-ones D=128: streamed $(t --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-mask-scan streamed) | prepass $(t --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-mask-scan prepass)"
timeout 40 $F $T --N 32768 --window 1024 --dma-mask-scan streamed --sdpa --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|sdpa)" | cut -c1-150
timeout 150 $B/test_dmattn > $L/fwd_tests.log 2>&1; el "test_dmattn rc=$? $(tail -1 $L/fwd_tests.log)"; grep -m12 FAIL $L/fwd_tests.log | cut -c1-240
el done
