#!/usr/bin/env bash
# Session 15, first device call: gpu_check's tests and sanitizers (no
# benchmarks, no ncu) — session 14's new sanitizer shapes and test_dmattn
# top-W cases, the shared first_query_tile and the paired-key-tile patch's
# tests — then the paired backward's own probe. Results in $OUT/check.tgz,
# $OUT/check_summary.md and $OUT/paired/summary.txt.
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}
mkdir -p $O/paired
OUT=/tmp/check SKIP_BENCH=1 NCU=0 timeout ${CHECK_S:-340} scripts/gpu_check.sh > $O/check.log 2>&1; echo "gpu_check rc=$?"
grep -E "^(gpu variants|test_dmattn|memcheck|racecheck)|tests passed|build failed|error|^=== " $O/check.log | cut -c1-220 | head -60
cp /tmp/check/summary.md $O/check_summary.md 2>/dev/null
tar czf $O/check.tgz -C /tmp check
OUT=$O/paired TESTS_LOG=/tmp/check/dmattn_backward_tests.log timeout ${PAIRED_S:-230} bash scripts/probes/next_bwd_paired.sh > /dev/null 2>&1; echo "paired rc=$?"
cat $O/paired/summary.txt
