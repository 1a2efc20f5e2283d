#!/usr/bin/env bash
# The end-of-session device call: scripts/gpu_check.sh (everything), then the
# five dynamic-mask tables; each result folder comes back as one archive
# (the device returns at most 8 files).
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
OUT=/tmp/check timeout 470 scripts/gpu_check.sh > $O/gpu_check.log 2>&1; echo "gpu_check rc=$?"
grep -E "^(gpu variants|test_dmattn|memcheck|racecheck)|tests passed|build failed|error" $O/gpu_check.log | cut -c1-200 | head -40
cp /tmp/check/summary.md $O/ 2>/dev/null
tar czf $O/check.tgz -C /tmp check
BUILD_DIR=build-gpu DMATTN_OUT=/tmp/tables timeout 110 scripts/dmattn_tables > $O/tables.log 2>&1; echo "tables rc=$?"
tail -5 $O/tables.log
tar czf $O/tables.tgz -C /tmp tables
