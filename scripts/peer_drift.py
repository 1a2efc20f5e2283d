"""How far the peers and the rungs moved between two runs of one benchmark set.

    scripts/peer_drift.py BEFORE.csv AFTER.csv [--threshold 0.05]

A ratio to a peer is only as steady as the peer: the same torch on the same
kind of card has run cuDNN's backward 10 % slower in one run than in the
runs around it while our rows stayed within 1 %. For every shape in both
CSVs (B, H, Hkv, Nq, Nk, D, Dv, dtype, causal) this prints each peer's
TFLOPS before and after, and the median after / before of the rungs the two
runs share (for scale: the rungs move when the code does, the peers should
not); a shape where a peer moved by more than the threshold is marked, and
the last line counts them:

    peer drift: 2 of 11 shapes (threshold 5 %)

Informational: exit 0 whatever moved, 2 when a CSV cannot be read. gpu_check.sh
runs it after the bench and bwd steps against the results it replaces.
Standard library only.
"""
import argparse
import statistics
import sys

import results_csv as rc

SHAPE = tuple(k for k in rc.KEY if k != "variant")  # a row's shape: its merge key without the variant


def by_shape(rows):
    """{shape: {variant: row}} of the rows that ran."""
    shapes = {}
    for row in rows:
        if rc.ran(row):
            shapes.setdefault(tuple(row[k] for k in SHAPE), {})[row["variant"]] = row
    return shapes


def label(row):
    causal = " causal" if row["causal"] else ""
    n = f"N{row['Nq']}" if row["Nq"] == row["Nk"] else f"Nq{row['Nq']} Nk{row['Nk']}"
    return f"B{row['B']} H{rc.heads_label(row)} {n} D{rc.dims_label(row)} {row['dtype']}{causal}"


def drift(before, after, threshold):
    """(lines, flagged, compared): one line per shape in both runs with a peer in each."""
    old, new = by_shape(before), by_shape(after)
    lines, flagged, compared = [], 0, 0
    for shape, rows in new.items():
        prev = old.get(shape)
        if not prev:
            continue
        peers = [v for v, r in rows.items() if r["kind"] == rc.PEER and v in prev]
        rungs = [v for v, r in rows.items() if r["kind"] == rc.RUNG and v in prev]
        if not peers:
            continue
        compared += 1
        moved = [rows[v]["tflops"] / prev[v]["tflops"] for v in peers]
        parts = [f"{v} {prev[v]['tflops']:.1f} -> {rows[v]['tflops']:.1f} ({m:.2f}x)" for v, m in zip(peers, moved)]
        if rungs:
            rung_move = statistics.median(rows[v]["tflops"] / prev[v]["tflops"] for v in rungs)
            parts.append(f"rungs (median of {len(rungs)}) {rung_move:.2f}x")
        else:
            parts.append("no rung in both")
        drifted = [v for v, m in zip(peers, moved) if abs(m - 1.0) > threshold]
        mark = ""
        if drifted:
            flagged += 1
            mark = f"  <-- moved: {', '.join(drifted)}"
        lines.append(f"{label(next(iter(rows.values())))}: " + ", ".join(parts) + mark)
    return lines, flagged, compared


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--threshold", type=float, default=0.05, help="fraction; default 0.05")
    args = ap.parse_args(argv)
    try:
        before, after = rc.load([args.before]), rc.load([args.after])
    except rc.CsvError as e:
        print(f"peer_drift.py: {e}", file=sys.stderr)
        return 2
    lines, flagged, compared = drift(before, after, args.threshold)
    for line in lines:
        print(line)
    print(f"peer drift: {flagged} of {compared} shapes (threshold {args.threshold * 100:.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
