#!/usr/bin/env bash
# The summary of a gpu_check folder, from what the folder holds:
#   scripts/gpu_summary.sh OUT_DIR > OUT_DIR/summary.md
# gpu_check.sh calls it at the end of each step. Sections, each where its file
# is there: the machine; the tests (tests.txt, from `gpu_check.sh check`); the
# sanitizers (sanitizer_summary.txt: a tally per tool, every run that was not
# clean in full); the benchmarks (bench.csv, and the dense backward's bwd.csv:
# the best rung and the best peer of each shape; dmattn.csv: one line per
# dynamic-mask run). The rest (every
# row, the GEMM ceiling, ncu's counters) is in the folder's other files and
# in logs.tar.gz. SOFTWARE (scripts/run_info.py's line: torch, cuDNN, CUDA,
# driver, flash-attn-4, CUTLASS DSL) adds a line under the machine's. Where nvidia-smi does not
# say (a folder copied off the GPU machine), the GPU and driver come from the
# CSVs; SUMMARY_NOTE adds a line saying how the summary was made.
set -uo pipefail
out=${1:?usage: gpu_summary.sh OUT_DIR}

echo "# attnlab GPU check"
echo
[ -n "${SUMMARY_NOTE:-}" ] && { echo "> $SUMMARY_NOTE"; echo; }
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
if [ -z "$gpu" ]; then  # the first CSV row's gpu and driver columns
  gpu=$(tail -qn +2 "$out/bench.csv" "$out/bwd.csv" "$out/dmattn.csv" 2>/dev/null | head -1 | cut -d, -f1,2 |
        sed 's/,/, driver /')
fi
cuda=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | sed 's/release //')
echo "- machine: ${gpu:-unknown GPU}; CUDA ${cuda:-unknown}; torch ${TORCH_VERSION:-unknown}; built for sm_${CUDA_ARCH:-90a}"
[ -n "${SOFTWARE:-}" ] && echo "- $SOFTWARE"

if [ -f "$out/tests.txt" ]; then
  echo
  echo "## Tests"
  echo
  cat "$out/tests.txt"
fi

if [ -f "$out/sanitizer_summary.txt" ]; then
  echo
  echo "## compute-sanitizer (ragged shapes; every rung on the rung shapes)"
  echo
  for tool in memcheck racecheck synccheck; do
    runs=$(grep -c "^$tool " "$out/sanitizer_summary.txt")
    clean=$(grep "^$tool " "$out/sanitizer_summary.txt" | grep -c ': rc=0 ')
    [ "$runs" -gt 0 ] && echo "- $tool: $clean of $runs runs clean"
  done
  grep -v ': rc=0 ' "$out/sanitizer_summary.txt" | sed 's/^/- /'
  grep 'EMPTY MASK' "$out/sanitizer_summary.txt" | sed 's/^/- warning: /'
fi

python3 - "$out" "$(dirname "$0")" <<'EOF'
import csv
import os
import sys

out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import results_csv as rc  # noqa: E402  (the CSV reader and best-row rules the plots use)


def rows(name):
    path = os.path.join(out, name)
    if not os.path.isfile(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def provenance(rs):
    _, commits, span = rc.provenance(rs)
    return f"commit {commits}, {span}"


def best_table(name, title, flops):
    """The best rung and the best peer of each shape of `name` (merged rows), when the file is there."""
    path = os.path.join(out, name)
    rs_all = rc.load([path]) if os.path.isfile(path) else []
    if not rs_all:
        return
    print(f"\n## {title} ({name}; {provenance(rs_all)})\n")
    print(f"TFLOPS = {flops}·unmasked pairs / median time; fp16 unless noted.\n")
    print("B,H,Nq,Nk,D: H/Hkv for GQA, D/Dv where they differ.\n")
    print("| B,H,Nq,Nk,D | dtype | causal | best rung | TFLOPS | best peer | TFLOPS | × peer | checks |")
    print("|---|---|---|---|---|---|---|---|---|")
    shapes = {}
    for r in rs_all:
        shapes.setdefault((r["B"], rc.heads_label(r), r["Nq"], r["Nk"], rc.dims_label(r), r["dtype"], r["causal"]),
                          []).append(r)
    for key, rs in shapes.items():
        rung, peer = rc.best(rs, rc.RUNG), rc.best(rs, rc.PEER)
        cell = lambda r: (r["variant"], rc.fmt_tflops(r["tflops"])) if r else ("-", "-")
        ratio = rc.best_ratio(rs)
        failed = sum(r["status"] == "FAIL" for r in rs)
        checked = sum(r["status"] in ("PASS", "FAIL") for r in rs)
        checks = f"{checked - failed}/{checked} pass" if checked else "timed only"
        B, H, Nq, Nk, D, dtype, causal = key
        print(f"| {B},{H},{Nq},{Nk},{D} | {dtype} | {causal} | {' | '.join(cell(rung))} | "
              f"{' | '.join(cell(peer))} | {'-' if ratio is None else rc.fmt_ratio(ratio)} | "
              f"{checks}{'; FAILED' if failed else ''} |")
    failed = sorted({r["variant"] for r in rs_all if r["status"] == "FAIL"})
    if failed:
        print(f"\nRows that FAILED their check: {', '.join(failed)}")


best_table("bench.csv", "Benchmarks", "2·B·H·(D+Dv)")
best_table("bwd.csv", "Dense backward", "2·B·H·(3D+2Dv)")

dmattn = rows("dmattn.csv")
if dmattn:
    print(f"\n## Dynamic-mask attention (dmattn.csv; {provenance(dmattn)})\n")
    print("One line per run: its dmattn row; × peer = the best masked torch peer's time / this time.\n")
    print("| run | B,H,Nq,Nk,D | causal | options | ms | TFLOPS | × peer | status |")
    print("|---|---|---|---|---|---|---|---|")
    wanted = ("Hkv=", "mask=", "bias", "splits ", "core ", "mask scan ", "q chunks ")
    for r in dmattn:
        if r["kind"] != "rung" or not (r["variant"] == "dmattn" or r["variant"].startswith("dmattn bwd")):
            continue
        if "(bit-packed mask)" in r["variant"]:
            continue
        options = "; ".join(part for part in r["note"].split("; ") if part.startswith(wanted))
        print(f"| {r['variant']} | {r['B']},{r['H']},{r['Nq']},{r['Nk']},{r['D']} | {r['causal']} | {options} | "
              f"{float(r['time_ms']):.3f} | {float(r['tflops']):.1f} | {r['ratio_to_best_peer'] or '-'} | {r['status']} |")
    failed = [r for r in dmattn if r["status"] == "FAIL"]
    if failed:
        print(f"\n{len(failed)} dynamic-mask rows FAILED their check:", ", ".join(r["variant"] for r in failed))
EOF

