#!/usr/bin/env python3
"""Fill the measured-numbers table of each rung's docs page from one GPU's results.

    python3 scripts/doc_tables.py results/H200 docs/*.md

A page marks its table with two lines of their own,
    <!-- numbers: share-kv prev=split-q -->
    ...
    <!-- numbers:end -->
and gets, from the GPU folder's merged forward rows (results_csv.load_gpu),
for every shape the rows have for that rung: each stage's TFLOPS, the previous
rung's best, the best peer and the ratio of the rung's best stage to that
peer and to sdpa(flash). Of the square shapes the plots show (the most common
B and H, fp16), only N = 8192 is listed (the plots have the other N); every
other shape is listed. With prev=, the block ends with one line: the best stage
against the previous rung's best at N = 8192 for each head dim, causal in
brackets. A backward rung's block (ladder.BACKWARD, e.g. bwd-ws) is the same
table from the folder's backward rows (results_csv.load_bwd, bwd.csv), its
variants against the peers' backward rows ("sdpa(cudnn) bwd"), with the ratio
to sdpa(cudnn) bwd and to sdpa(flash) bwd; without a bwd.csv it says so.
Pages without the marker are left alone (scripts/regenerate.py fills every page).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402
import results_csv as rc  # noqa: E402

MARKER = re.compile(r"^<!-- numbers: (?P<rung>[\w-]+)(?: prev=(?P<prev>[\w-]+))? -->\n.*?^<!-- numbers:end -->$",
                    re.S | re.M)
SHAPE = ("B", "H", "Hkv", "Nq", "Nk", "D", "Dv", "dtype", "causal")
# The peers a rung's best is divided by, beyond the best peer: forward, backward.
RATIO_PEERS = {False: ("sdpa(flash)",), True: ("sdpa(cudnn)" + ladder.BWD, "sdpa(flash)" + ladder.BWD)}
NO_BWD_CSV = ("The results have no bwd.csv (the dense backward's rows, from `scripts/gpu_check.sh bwd`), "
              "so no timed row of this rung.")


def of(variant, prefix):
    """Whether `variant` is one of the rung `prefix`'s: PREFIX or PREFIX+stage..."""
    return ladder.is_variant_of(variant, prefix)


def stage(variant, prefix):
    """The stage part of a variant's name ('split-q+stage2' -> 'stage2'); the name when it has none."""
    return variant[len(prefix) + 1:] or variant


def shape_of(row):
    return tuple(row[k] for k in SHAPE)


def best_of(rows, prefix):
    cands = [r for r in rows if of(r["variant"], prefix) and rc.ran(r)]
    return max(cands, key=lambda r: (r["tflops"], r["variant"]), default=None)


def listed(shape, sl, n):
    """Whether the table lists `shape`: a square shape of the plots' slice only at N = n."""
    B, H, Hkv, Nq, Nk, D, Dv, dtype, causal = shape
    in_slice = sl is not None and (B, H, dtype) == (sl.B, sl.H, sl.dtype) and Nq == Nk
    return not in_slice or Nq == n


def table_shapes(rows, rung):
    """(the shapes `rung`'s table lists, in order: those where a stage ran; the head dims where none ran)."""
    sl = rc.forward_slice(rows)
    n = rc.preferred_n(sl.values("Nq")) if sl else rc.TABLE_N
    mine = [r for r in rows if of(r["variant"], rung)]
    all_shapes = sorted({shape_of(r) for r in mine if listed(shape_of(r), sl, n)})
    ran_at = {shape_of(r) for r in mine if rc.ran(r)}
    # Shapes where no stage of the rung ran are summed up in one line below the table.
    shapes = [sh for sh in all_shapes if sh in ran_at]
    skipped = sorted({sh[5] for sh in all_shapes if sh not in shapes} - {sh[5] for sh in shapes})
    return shapes, skipped


def table(rows, rung, prev, backward=False):
    """The block's body: the forward table of `rung` from forward rows, or with backward=True from backward rows."""
    word, source = ("variant", "bwd.csv") if backward else ("stage", "The results CSV")
    sl = rc.forward_slice(rows)
    n = rc.preferred_n(sl.values("Nq")) if sl else rc.TABLE_N
    mine = [r for r in rows if of(r["variant"], rung)]
    shapes, skipped = table_shapes(rows, rung)
    stages = sorted({r["variant"] for r in mine}, key=lambda v: ladder.stage_order(rung, v))
    if not shapes:  # a rung the CSVs have no timings of (yet): say so instead of an empty table
        why = f" (its rows at head dims {', '.join(str(d) for d in skipped)} say why)" if skipped else ""
        return f"{source} has no timed row of this rung{why}."
    head = ["B,H,Nq,Nk,D", "dtype", "causal"] + [stage(s, rung) for s in stages]
    if prev:
        head.append(f"best {prev}")
    head += ["best peer", f"best {word} / best peer"] + [f"best {word} / {p}" for p in RATIO_PEERS[backward]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    used = []
    for shape in shapes:
        at = [r for r in rows if shape_of(r) == shape]
        B, H, Hkv, Nq, Nk, D, Dv, dtype, causal = shape
        heads, dims = rc.heads_label(at[0]), rc.dims_label(at[0])
        cells = [f"{B},{heads},{Nq},{Nk},{dims}", dtype, "yes" if causal else "no"]
        for s in stages:
            row = next((r for r in at if r["variant"] == s), None)
            cells.append(rc.fmt_tflops(row["tflops"]) if row and rc.ran(row) else (row["status"] if row else "–"))
        if prev:
            p = best_of(at, prev)
            cells.append(f"{p['tflops']:.1f} ({stage(p['variant'], prev)})" if p else "–")
        peer = rc.best(at, rc.PEER)
        cells.append(f"{peer['tflops']:.1f} {peer['variant']}" if peer else "–")
        best = best_of(at, rung)
        cells.append(rc.fmt_ratio(best["tflops"] / peer["tflops"]) if peer else "–")
        for name in RATIO_PEERS[backward]:
            theirs = rc.tflops(at, name)
            cells.append(rc.fmt_ratio(best["tflops"] / theirs) if theirs else "–")
        lines.append("| " + " | ".join(cells) + " |")
        used += [r for r in at if rc.ran(r)]
    gpus, commits, span = rc.provenance(used)
    one_run = all(len({rc.run_of(r) for r in rows if shape_of(r) == sh and rc.ran(r)}) == 1 for sh in shapes)
    where = ("each shape's rows from one run: peers measured in the same process on the same inputs" if one_run else
             "rows merged from more than one run (the newest row of each variant and shape)")
    lines += ["", f"TFLOPS on {gpus}, commit {commits}, {span}; {where}."]
    if skipped:
        lines.append(f"Not run at head dims {', '.join(str(d) for d in skipped)} (unsupported; the CSV rows say why).")
    if prev:
        lines += ["", verdict(rows, rung, prev, sl, n, word)]
    return "\n".join(lines)


def verdict(rows, rung, prev, sl, n, word="stage"):
    """One line: the best stage over prev's best at N = n in the plots' slice, per head dim."""
    head = f"Best {word} against best {prev}"
    if sl is None:
        return f"{head}: no square shapes to compare."
    parts, mixed = [], False
    for d in sl.values("D"):
        ratios = {}
        for causal in sl.values("causal"):
            at = sl.at(Nq=n, D=d, causal=causal)
            mine, theirs = best_of(at, rung), best_of(at, prev)
            if mine and theirs:
                ratios[causal] = f"{mine['tflops'] / theirs['tflops']:.2f}×"
                mixed |= rc.run_of(mine) != rc.run_of(theirs)
        if 0 in ratios:
            parts.append(f"D={d} {ratios[0]}" + (f" (causal {ratios[1]})" if 1 in ratios else ""))
        elif 1 in ratios:
            parts.append(f"D={d} causal {ratios[1]}")
    if not parts:
        return f"{head} at N={n}: no head dim where both ran."
    runs = "rows of different runs" if mixed else "same runs"
    return f"{head} at N={n}, {sl.describe()} ({runs}): {', '.join(parts)}."


def fill(text, rows, bwd_rows=None):
    """`text` with every numbers block regenerated: forward rungs' from `rows`, backward rungs' from
    `bwd_rows` (None: the folder has no bwd.csv)."""
    def one(m):
        rung, prev = m.group("rung"), m.group("prev")
        if not ladder.is_backward(rung):
            body = table(rows, rung, prev)
        else:
            body = NO_BWD_CSV if bwd_rows is None else table(bwd_rows, rung, prev, backward=True)
        return m.group(0).split("\n", 1)[0] + "\n" + body + "\n<!-- numbers:end -->"
    return MARKER.sub(one, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a GPU's results folder, e.g. results/H200")
    ap.add_argument("pages", nargs="+")
    args = ap.parse_args(argv)
    try:
        rc.load_gone_commits(os.path.dirname(os.path.abspath(args.folder)))
        rows, bwd_rows = rc.load_gpu(args.folder), rc.load_bwd(args.folder)
    except rc.CsvError as e:
        print(f"doc_tables.py: error: {e}", file=sys.stderr)
        return 2
    for page in args.pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        new = fill(text, rows, bwd_rows)
        if new != text:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
