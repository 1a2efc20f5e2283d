#!/usr/bin/env bash
# The summary of one gpu_check run, from the logs in its output folder:
#   scripts/gpu_summary.sh OUT_DIR > OUT_DIR/summary.md
# gpu_check calls it at its end. It also runs on a folder copied off the GPU
# machine (for a run cut short before its summary): where nvidia-smi or the
# environment (ATTNLAB_COMMIT, TORCH_VERSION, CUDA_ARCH) do not say, the GPU,
# driver, CUDA, torch and commit come from the harness's header line in
# bench.txt, and SUMMARY_NOTE adds a line saying how the summary was made.
set -uo pipefail
out=${1:?usage: gpu_summary.sh OUT_DIR}
csv="$out/bench.csv"
# "NVIDIA H200 | driver 580.159.04 | CUDA runtime 13.0, driver API 13.0 | torch 2.11.0 | attnlab 39ec995 | date"
header=$(grep -hm1 -E '^NVIDIA .*\| driver ' "$out/bench.txt" "$out/dmattn_bench.txt" 2>/dev/null | head -1)
field() { awk -F' [|] ' -v n="$1" '{print $n}' <<<"$header"; }
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu" ] || gpu=$([ -n "$header" ] && echo "$(field 1), $(field 2 | sed 's/^driver //')" || echo "unknown (no nvidia-smi, no harness header in bench.txt)")
if [ -z "${SUMMARY_NOTE:-}" ] && command -v nvcc >/dev/null; then cuda=$(nvcc --version | tail -1); else cuda=$(field 3); fi
commit=${ATTNLAB_COMMIT:-$(field 5 | sed 's/^attnlab //')}
torch=${TORCH_VERSION:-$(field 4 | sed 's/^torch //')}
last() { tail -1 "$1" 2>/dev/null; }
echo "# attnlab GPU check"
echo
[ -n "${SUMMARY_NOTE:-}" ] && { echo "> $SUMMARY_NOTE"; echo; }
echo "- GPU: $gpu"
echo "- CUDA: $cuda"
echo "- commit: $commit"
echo "- date: ${SUMMARY_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}"
echo "- GPU variant tests${ONLY:+ (only $ONLY)}: $(last "$out/gpu_variants.log")"
echo "- ctest: $(grep -E 'tests passed' "$out/tests.log" 2>/dev/null)"
python_line=$(grep -E "[0-9]+ passed" "$out/tests.log" 2>/dev/null | grep -vE "^[0-9]+ passed, [0-9]+ failed$" | tail -1)
echo "- pytest (tests/python): ${python_line:-see ctest (label gpu); ctest prints the pytest output only on failure}"
echo "- torch: $torch"
[ -f "$out/sanitizer_summary.txt" ] && { echo "- compute-sanitizer:"; sed 's/^/  - /' "$out/sanitizer_summary.txt"; }
echo
echo "## Benchmarks (fp16 unless noted; TFLOPS = 2·B·H·(D+Dv)·unmasked pairs / median time)"
echo
echo "| variant | B,H,Nq,Nk,D | dtype | causal | ms | TFLOPS | x best peer | status |"
echo "|---|---|---|---|---|---|---|---|"
tail -n +2 "$csv" | awk -F, '{printf "| %s | %s,%s,%s,%s,%s | %s | %s | %s | %s | %s | %s |\n", $6, $8, $9, $10, $11, $12, $14, $15, $16, $17, $18, $19}'
echo
if [ -s "$out/gemm_ceiling.txt" ]; then
  echo "## The GEMM ceiling (cuBLAS through torch; scripts/gemm_ceiling.py)"
  echo
  echo '```'
  cat "$out/gemm_ceiling.txt"
  echo '```'
  echo
fi
if [ -f "$out/dmattn_bench.txt" ]; then
  echo "## Dynamic-mask attention (issue 5)"
  echo
  for t in dmattn dmattn_reference dmattn_summary dmattn_backward_reference dmattn_backward; do
    echo "- test_$t: $(last "$out/${t}_tests.log")"
  done
  echo
  echo '```'
  grep -vE "^-+$" "$out/dmattn_bench.txt"
  echo '```'
  echo
fi
if [ -f "$out/ncu_bank_conflicts.txt" ]; then
  echo "## Shared-memory bank conflicts (ncu), split-q padded vs swizzled"
  echo
  echo '```'
  cat "$out/ncu_bank_conflicts.txt"
  echo '```'
  echo
fi
echo "## Registers (ptxas, sm_${CUDA_ARCH:-90a})"
echo
echo '```'
cat "$out/ptxas_split_q.txt" 2>/dev/null
echo '```'
