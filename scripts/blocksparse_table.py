"""The block-sparse results table of docs/blocksparse.md, from results/<gpu>/blocksparse.csv.

    <!-- blocksparse:begin --> ... <!-- blocksparse:end -->

blocksparse.csv (scripts/bench_blocksparse.py) has the results columns
(results_csv.COLUMNS) and `mask`, `score`; its rows are merged by
results_csv's rule (the newest date of each variant, shape, mask and score).
One line per (shape, mask, score): our forward and backward TFLOPS
(attnlab.flex_attention's, or dmattn's on a dmattn_topk mask), compiled
flex_attention's measured in the same process, and their ratio; a row that
did not pass its check shows its status instead of a number.
"""
import csv
import os

import results_csv as rc

BEGIN, END = "<!-- blocksparse:begin -->", "<!-- blocksparse:end -->"
CSV = "blocksparse.csv"
OURS, PEER = "blocksparse", "flex_attention"
DMATTN = "dmattn"  # ours on the masks named dmattn_* (bench_blocksparse.py's dmattn_topk cases)


def load(folder):
    """The merged rows of `folder`'s blocksparse.csv, or None without one."""
    path = os.path.join(folder, CSV)
    if not os.path.isfile(path):
        return None
    latest = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in rc.COLUMNS + ("mask", "score") if c not in (reader.fieldnames or ())]
        if missing:
            raise rc.CsvError(f"{path}: not a block-sparse results CSV, missing column(s): {' '.join(missing)}")
        for row in reader:
            extra = {"mask": row.pop("mask"), "score": row.pop("score")}
            row = {**rc._parse(row, f"{path}:{reader.line_num}"), **extra}
            key = tuple(row[k] for k in rc.KEY) + (row["mask"], row["score"])
            if key not in latest or row["date"] >= latest[key]["date"]:
                latest[key] = row
    return list(latest.values())


def _figure(row):
    if row is None:
        return "—"
    if row["status"] not in ("PASS", "unchecked") or row["tflops"] is None:
        return row["status"] or "—"
    return f"{row['tflops']:.1f}"


def _ratio(ours, peer):
    ok = all(r is not None and r["status"] == "PASS" and r["tflops"] for r in (ours, peer))
    return f"{ours['tflops'] / peer['tflops']:.2f}×" if ok else "—"


def block(rows, csv_link):
    """The table's markdown (or a line saying there are no results yet)."""
    if not rows:
        return f"No block-sparse results yet (`scripts/gpu_check.sh blocksparse` writes `{csv_link}`)."
    cases, by = [], {}
    for r in rows:
        case = (r["B"], r["H"], r["Nq"], r["D"], r["Dv"], r["dtype"], r["mask"], r["score"])
        if case not in by:
            cases.append(case)
        by.setdefault(case, {})[r["variant"]] = r
    gpus = sorted({r["gpu"] for r in rows})
    lines = [f"TFLOPS on {', '.join(gpus)} from `{csv_link}` (forward 2·B·H·(D+Dv)·pairs, backward "
             "2·B·H·(3D+2Dv)·pairs, pairs the (query, key) pairs the mask keeps); flex_attention is torch's, "
             "compiled, on the same block mask, in the same process; ours is dmattn on the `dmattn_topk` masks, and "
             "the block-sparse engine on them where marked (engine: the mask a tensor mask_mod, the bias a tensor "
             "score_mod).", "",
             "| shape | mask_mod | score_mod | ours fwd | flex fwd | × | ours bwd | flex bwd | × |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        B, H, N, D, Dv, dtype, mask, score = case
        v = by[case]
        # dmattn's masks: dmattn, then the engine where it ran them (a tensor mask_mod and score_mod)
        names = [DMATTN] + ([OURS] if OURS in v else []) if mask.startswith(DMATTN) else [OURS]
        for ours in names:
            fwd, fwd_peer = v.get(ours), v.get(PEER)
            bwd, bwd_peer = v.get(ours + " bwd"), v.get(PEER + " bwd")
            dims = f"D{D}" if D == Dv else f"D{D}/{Dv}"
            label = f"`{mask.replace(';', ',')}`" + (" (engine)" if ours == OURS and len(names) > 1 else "")
            lines.append(f"| B{B} H{H} N{N} {dims} {dtype} | {label} | {score} | {_figure(fwd)} | "
                         f"{_figure(fwd_peer)} | {_ratio(fwd, fwd_peer)} | {_figure(bwd)} | {_figure(bwd_peer)} | "
                         f"{_ratio(bwd, bwd_peer)} |")
    return "\n".join(lines)
