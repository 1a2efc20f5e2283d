#!/usr/bin/env python3
"""Fill the measured-numbers table of each rung's docs page from a results CSV.

    python3 scripts/doc_tables.py results/H200/bench.csv docs/*.md

A page marks its table with
    <!-- numbers: share-kv prev=split-q -->
    ...
    <!-- numbers:end -->
and gets, for every shape the CSV has for that rung: each stage's TFLOPS, the
previous rung's best, the best peer and the ratio of the rung's best stage to
that peer (all from the same run). Pages without the marker are left alone.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_csv as rc  # noqa: E402

MARKER = re.compile(r"<!-- numbers: (?P<rung>[\w-]+)(?: prev=(?P<prev>[\w-]+))? -->\n.*?<!-- numbers:end -->",
                    re.S)
SHAPE = ("B", "H", "Nq", "Nk", "D", "dtype", "causal")


def best_of(rows, prefix):
    cands = [r for r in rows if r["variant"].startswith(prefix + "+") and rc.ran(r)]
    return max(cands, key=lambda r: r["tflops"], default=None)


def table(rows, rung, prev):
    all_shapes = sorted({tuple(r[k] for k in SHAPE) for r in rows if r["variant"].startswith(rung + "+")})
    # Shapes where no stage of the rung ran are summed up in one line below the table.
    shapes = [sh for sh in all_shapes
              if any(rc.ran(r) for r in rows if tuple(r[k] for k in SHAPE) == sh and r["variant"].startswith(rung + "+"))]
    skipped = sorted({sh[4] for sh in all_shapes if sh not in shapes} - {sh[4] for sh in shapes})
    stages = sorted({r["variant"] for r in rows if r["variant"].startswith(rung + "+")})
    if not shapes:  # a rung the CSV has no timings of (yet): say so instead of an empty table
        why = f" (its rows at head dims {', '.join(str(d) for d in skipped)} say why)" if skipped else ""
        return f"The results CSV has no timed row of this rung{why}."
    head = ["B,H,Nq,Nk,D", "dtype", "causal"] + [s.split("+", 1)[1] for s in stages]
    if prev:
        head.append(f"best {prev}")
    head += ["best peer", "best stage / best peer", "best stage / sdpa(flash)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        at = [r for r in rows if tuple(r[k] for k in SHAPE) == shape]
        B, H, Nq, Nk, D, dtype, causal = shape
        cells = [f"{B},{H},{Nq},{Nk},{D}", dtype, "yes" if causal else "no"]
        for s in stages:
            row = next((r for r in at if r["variant"] == s), None)
            cells.append(rc.fmt_tflops(row["tflops"]) if row and rc.ran(row) else (row["status"] if row else "–"))
        if prev:
            p = best_of(at, prev)
            cells.append(f"{p['tflops']:.1f} ({p['variant'].split('+', 1)[1]})" if p else "–")
        peer = rc.best(at, rc.PEER)
        cells.append(f"{peer['tflops']:.1f} {peer['variant']}" if peer else "–")
        mine = best_of(at, rung)
        cells.append(rc.fmt_ratio(mine["tflops"] / peer["tflops"]) if mine and peer else "–")
        fa2 = rc.tflops(at, "sdpa(flash)")
        cells.append(rc.fmt_ratio(mine["tflops"] / fa2) if mine and fa2 else "–")
        lines.append("| " + " | ".join(cells) + " |")
    gpus, commits, span = rc.provenance([r for r in rows if tuple(r[k] for k in SHAPE) in shapes])
    lines.append("")
    lines.append(f"TFLOPS on {gpus}, commit {commits}, {span}; peers measured in the same process on the same inputs.")
    if skipped:
        lines.append(f"Not run at head dims {', '.join(str(d) for d in skipped)} (unsupported; the CSV rows say why).")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("pages", nargs="+")
    args = ap.parse_args()
    try:
        rows = rc.load([args.csv])
    except rc.CsvError as e:
        sys.exit(f"doc_tables.py: error: {e}")
    for page in args.pages:
        text = open(page, encoding="utf-8").read()

        def fill(m):
            body = table(rows, m.group("rung"), m.group("prev"))
            return m.group(0).split("\n", 1)[0] + "\n" + body + "\n<!-- numbers:end -->"

        new = MARKER.sub(fill, text)
        if new != text:
            open(page, "w", encoding="utf-8").write(new)
            print(f"wrote {page}")


if __name__ == "__main__":
    main()
