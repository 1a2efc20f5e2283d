#!/usr/bin/env bash
# Session 14, first device call: session 13's two patches (applied with git am)
# run through their own probes, one process each under its own limit, results
# in $OUT/scan/ and $OUT/rotate/. Ran at d4c3168 (both probes are in that
# commit; the results are results/H200/probes/session14_*.txt).
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}
mkdir -p $O/scan $O/rotate
OUT=$O/scan timeout ${SCAN_S:-330} bash scripts/probes/next_scan_segments.sh > /dev/null 2>&1; echo "scan rc=$?"
OUT=$O/rotate timeout ${ROTATE_S:-240} bash scripts/probes/next_bwd_rotate.sh > /dev/null 2>&1; echo "rotate rc=$?"
cat $O/scan/summary.txt $O/rotate/summary.txt
