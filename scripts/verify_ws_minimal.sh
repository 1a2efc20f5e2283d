#!/usr/bin/env bash
# One-off: build, check and time rung 12 (ws*) and rung 00 (minimal) on the H200.
set -uo pipefail
cd "$(dirname "$0")/.."
o=${OUT:-/tmp/out}; mkdir -p $o
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a > $o/build.log 2>&1 &&
  cmake --build build -j16 --target flash_attn_mma test_gpu_variants >> $o/build.log 2>&1 || { tail -30 $o/build.log; exit 1; }
echo "build: $((SECONDS-T0)) s"
export ATTNLAB_UNVERIFIED=1
B=build/flash_attn_mma
san() { local tool=$1; shift; timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B --B 1 --H 2 "$@" --iters 1 --warmup 0 --check --show-all --variant 'ws*,minimal' > $o/san_$tool.log 2>&1; echo "$tool $*: rc=$? $(grep -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' $o/san_$tool.log | tail -1) $(grep -cE 'PASS' $o/san_$tool.log) PASS $(grep -cE 'FAIL' $o/san_$tool.log) FAIL"; }
{
for tool in memcheck racecheck synccheck; do
  san $tool --Nq 129 --Nk 77 --D 64 --causal
  san $tool --Nq 17 --Nk 200 --D 128 --dtype bf16
  san $tool --Nq 130 --Nk 333 --D 256 --causal
done
} > $o/sanitizers.txt 2>&1 &
SP=$!
timeout 300 build/test_gpu_variants 'ws*,minimal' > $o/variants.log 2>&1; echo "variants rc=$? $(tail -1 $o/variants.log) ($((SECONDS-T0)) s)"
wait $SP; cat $o/sanitizers.txt; echo "sanitizers done ($((SECONDS-T0)) s)"
for a in "--D 64" "--D 64 --causal" "--D 128" "--D 128 --causal" "--D 256" "--D 256 --causal"; do
  timeout 90 $B --B 1 --H 8 --N 8192 $a --check --sdpa --show-all --iters 20 --warmup 3 \
    --variant 'ws*,wgmma+stage2+overlap,two-pass+stage4,minimal' 2>&1 | tee -a $o/bench.txt | grep -E "ws|wgmma|two-pass|minimal|sdpa\(cudnn\)|sdpa\(flash\)|B=1" | sed 's/\[.*\], //' | cut -c1-170
done
timeout 60 $B --B 4 --H 16 --N 4096 --D 128 --causal --dtype bf16 --check --sdpa --show-all --iters 20 --warmup 3 --variant 'ws*,wgmma+stage2+overlap' 2>&1 | tee -a $o/bench.txt | grep -E "ws|wgmma|sdpa\(cudnn\)" | sed 's/\[.*\], //' | cut -c1-170
echo "total $((SECONDS-T0)) s"
