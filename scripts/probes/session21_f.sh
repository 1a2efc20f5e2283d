#!/usr/bin/env bash
# Session 21 (f), after the review: rungs 09-11 take their warp split from
# common/wgmma.cuh's ProducerWarpgroupSplit, and the dmattn harness's
# summary-given and bit-packed rows share one checked-and-timed helper. The
# variant tests of the three rungs, and the dmattn rows with --mask-bits.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
for v in 'tma-split*' 'cluster*' 'two-pass*'; do run_test 200 test_gpu_variants "$v"; done
timeout 120 $F --B 1 --H 2 --N 2048 --D 128 --causal --mask topk --window 512 --bias --mask-bits --check --iters 3 2>&1 |
  grep -E "dmattn|FAIL|rror" | cut -c1-200
timeout 120 $F --B 1 --H 2 --N 2048 --D 64 --mask topk --window 300 --block 0 --mask-bits --check --iters 3 2>&1 |
  grep -E "dmattn|FAIL|rror" | cut -c1-200
timeout 60 $F --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass+stage4' --iters 10 2>&1 | grep -E "^ *two-pass" | cut -c1-110
el done
