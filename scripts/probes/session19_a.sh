#!/usr/bin/env bash
# Session 19: the bit-packed mask (DmaMaskFormat::kBits, --mask-bits). Builds
# the harness and the three dmattn tests that cover it (the forward bitwise
# against the byte mask on every case, the summaries word for word, the
# backward against the reference and bitwise in deterministic mode); then
# the byte and bit rows side by side: all-ones + bias at D = 64 / 128 against
# the dense rung, the training shape at L = 16K / 32K on every mask scan (to
# set the automatic rule for bits), its torch peers at L = 32K, decoding at
# Nk = 512K, the backward rows, and the sanitizers on bit-packed shapes.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_summary test_dmattn_backward
run_test 150 test_dmattn_summary
run_test 300 test_dmattn
run_test 250 test_dmattn_backward
rows() { timeout 120 $F "$@" --mask-bits --iters 20 --warmup 3 2>&1 | grep -E "^ *(dmattn|split-q)[^:]*:|rror" | cut -c1-250; }
TRAIN="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"
for D in 64 128; do echo "== ones D=$D"; rows --B 1 --H 8 --N 8192 --D $D --mask ones --bias; done
for N in 32768 16384; do
  for scan in auto in-kernel prepass pipelined; do echo "== L=$N scan $scan"; rows $TRAIN --N $N --dma-mask-scan $scan; done
done
echo "== peers L=32K"
timeout 150 $F $TRAIN --N 32768 --mask-bits --sdpa --iters 10 --warmup 2 2>&1 | grep -E "dmattn|mask" | cut -c1-250
echo "== decode 512K"; rows --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias
el "forward rows"
for D in 128 64; do echo "== bwd all-active D=$D"; rows $BWD_DENSE --D $D --bwd | grep bwd; done
for N in 16384 32768; do echo "== bwd L=$N"; rows $TRAIN --N $N --bwd | grep bwd; done
el "backward rows"
for s in "--Nq 200 --Nk 1000 --D 128 --Hkv 1 --causal --mask topk --window 500 --bias --dma-mask-scan in-kernel" \
         "--Nq 130 --Nk 2333 --D 64 --mask topk --window 1166 --bias --dma-mask-scan pipelined --dma-prepass-chunks 3" \
         "--Nq 1 --Nk 20000 --D 256 --mask topk --window 3000 --block 0 --bias --splits 3" \
         "--Nq 200 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 64 --bias --bwd --bwd-chunks 3"; do
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 $s --mask-bits --iters 1 --warmup 0 --check > $L/san.log 2>&1
    el "$tool rc=$? $s $(grep -E 'SUMMARY' $L/san.log) $(grep -c FAIL $L/san.log) FAIL"
  done
done
tar czf $O/logs.tgz -C $L . 2>/dev/null
el done
