#!/usr/bin/env bash
# Session-4 probe A: rung 10 (D = 1024 cluster) smoke + tests + sanitizer,
# the dmattn-speed branch's tests and A/B benchmarks, and where the dynamic-mask
# forward's dense core loop loses against rung 02 (ncu per-SASS stall samples).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_backward test_gpu_variants
grep -E "spill|lmem" $L/build.log | grep -v " 0 bytes spill" | head
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# ---- rung 10 (hang risk: every call under timeout)
timeout 60 $F --B 1 --H 1 --Nq 64 --Nk 64 --D 1024 --variant 'cluster*' --check --iters 1 --warmup 0 --show-all 2>&1 | tail -4
echo "rc=$?"
timeout 60 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal --variant 'cluster*' --check --iters 1 --warmup 0 --show-all 2>&1 | tail -3
timeout 200 $B/test_gpu_variants 'cluster*' > $L/cluster_tests.log 2>&1; el "cluster tests rc=$? $(tail -1 $L/cluster_tests.log)"
grep -m5 FAIL $L/cluster_tests.log | cut -c1-200
for tool in memcheck racecheck synccheck; do
  echo "$tool: $(timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal --variant 'cluster*' --iters 1 --warmup 0 --check 2>&1 | grep -E 'ERROR SUMMARY|FAIL|error' | head -3 | tr '\n' ' ')"
done
el sanitized
timeout 150 $F --B 1 --H 8 --N 8192 --D 1024 --sdpa --torch --iters 10 --warmup 2 --show-all 2>&1 | grep -vE "^\s*$" | cut -c1-160 | tail -16
el "d1024 bench"
# ---- dmattn-speed branch
run_test 200 test_dmattn
run_test 200 test_dmattn_backward
for Lq in 16384 32768; do
  for knobs in "" "--block-order 0 --q-slots 1" "--block-order 1 --q-slots 1" "--block-order 0 --q-slots 2"; do
    echo "L=$Lq knobs=[$knobs]"
    timeout 60 $F --B 1 --H 2 --Hkv 1 --N $Lq --D 128 --causal --mask topk --window 1024 --bias --bwd $knobs --iters 10 --warmup 2 2>&1 | grep -E "^ *dmattn" | cut -c1-150
  done
done
el "speed A/B"
# ---- the dense core loop: dmattn (all-ones mask, no bias) vs rung 02; head-fastest vs batch order
for shape in "--B 1 --H 8" "--B 8 --H 1"; do
  timeout 60 $F $shape --N 8192 --D 128 --mask ones --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|split-q)" | cut -c1-170
done
NCU="timeout 120 ncu --clock-control none --import-source no --section WarpStateStats --section SourceCounters --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --launch-count 1"
$NCU -k regex:dma_forward_kernel -o $L/fwd $F --B 1 --H 8 --N 8192 --D 128 --mask ones --iters 1 --warmup 0 > $L/ncu_fwd.log 2>&1
$NCU -k regex:split_q_kernel -o $L/splitq $F --B 1 --H 8 --N 8192 --D 128 --variant 'split-q+stage2' --iters 1 --warmup 0 > $L/ncu_sq.log 2>&1
for r in fwd splitq; do
  ncu -i $L/$r.ncu-rep --page source --csv --print-source sass > $O/${r}_sass.csv 2>$L/${r}_src.err || head -3 $L/${r}_src.err
  ncu -i $L/$r.ncu-rep --page details > $L/${r}_details.txt 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Issue Slots|Stall|L2 Hit|L1/TEX Hit|Compute \(SM\)|Memory Throughput|Bank|Shared" $L/${r}_details.txt | cut -c1-150 | head -30
done
el "ncu"
ls -la $O
tar czf $O/logs.tgz -C /tmp logs
