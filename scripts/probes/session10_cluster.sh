#!/usr/bin/env bash
# Rung 10 (D = 1024): the partner's Σ pushed with st.async (one crossing of
# the SM-to-SM network, 16 KiB per block per tile, instead of a signal and a
# 32 KiB pull), and the next tile's scores issued before P·V so the exchange
# runs under it (+overlap). Tests, sanitizers for every variant, then the
# benchmark shape (twice, with torch's peers) and causal.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
run_test 400 test_gpu_variants 'cluster*'
for v in 'cluster-split-d+stage1+push' 'cluster-split-d+stage1+push+overlap'; do
  for tool in memcheck racecheck racecheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
      --variant "$v" --iters 1 --warmup 0 --check > $L/san.log 2>&1
    el "$v $tool rc=$? $(grep -E 'SUMMARY' $L/san.log) $(grep -cE 'FAIL' $L/san.log) FAIL"
  done
done
for i in 1 2; do
  timeout 200 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'cluster*' --torch --check --show-all > $L/bench$i.txt 2>&1
  el "bench $i rc=$?"; grep -E "cluster|unfused|efficient" $L/bench$i.txt | cut -c1-150
done
timeout 200 $F --B 1 --H 8 --N 8192 --D 1024 --causal --variant 'cluster*' --torch --check --show-all > $L/bench_causal.txt 2>&1
el "causal rc=$?"; grep -E "cluster|unfused" $L/bench_causal.txt | cut -c1-150
el done
