#!/usr/bin/env bash
# The end-of-session device calls: scripts/gpu_check.sh (everything), then the
# five dynamic-mask tables; each result folder comes back as one archive
# (the device returns at most 8 files). PART=check or PART=tables runs one
# half (each fits one 10-minute call; both together no longer do).
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
if [ "${PART:-check}" = check ] || [ "${PART:-}" = both ]; then
  OUT=/tmp/check timeout ${CHECK_TIMEOUT:-570} scripts/gpu_check.sh > $O/gpu_check.log 2>&1; echo "gpu_check rc=$?"
  grep -E "^(gpu variants|test_dmattn|memcheck|racecheck)|tests passed|build failed|error" $O/gpu_check.log | cut -c1-200 | head -40
  cp /tmp/check/summary.md $O/ 2>/dev/null
  tar czf $O/check.tgz -C /tmp check
fi
if [ "${PART:-check}" = tables ] || [ "${PART:-}" = both ]; then
  tp=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
  { cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$tp" &&
    cmake --build build-gpu -j 16 --target flash_attn_mma; } > $O/tables_build.log 2>&1 || { tail -30 $O/tables_build.log; exit 1; }
  BUILD_DIR=build-gpu DMATTN_OUT=/tmp/tables timeout ${TABLES_TIMEOUT:-400} scripts/dmattn_tables > $O/tables.log 2>&1; echo "tables rc=$?"
  tail -5 $O/tables.log
  tar czf $O/tables.tgz -C /tmp tables
fi
