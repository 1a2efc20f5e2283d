#!/usr/bin/env python3
"""Plots and a markdown summary of the dynamic-mask tables (scripts/dmattn_tables).

    python3 scripts/plot_dmattn.py results/H200/dmattn

Reads train.csv, window.csv, decode.csv, ones.csv and bwd.csv where present
(the harness's CSV schema; the mask window W and the share of tiles skipped
come from the note column) and writes, into the same folder:
  dmattn_<table>.png   time against the table's variable (L, W, Nk or D), dmattn
                       and every torch row given the same mask, and the speed-up
                       of dmattn over each peer
  summary.md           one table per CSV: the variable, unmasked pairs, tiles
                       skipped, each row's time and dmattn's speed-up over it
A docs page may hold one of those tables between two lines of their own,
    <!-- dmattn-table: train -->
    <!-- dmattn-table:end -->
(scripts/regenerate.py fills them from the docs GPU's results/<gpu>/dmattn/).
Exits 2, with one line on stderr, when the folder has none of the CSVs.
"""
import argparse
import csv
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generated  # noqa: E402
import results_csv as rc  # noqa: E402

TABLES = {  # name: (x column label, how to read x from a row)
    "train": ("L (Nq = Nk)", lambda r: int(r["Nk"])),
    "window": ("window W (keys kept per query)", lambda r: window_of(r)),
    "decode": ("Nk (Nq = 1)", lambda r: int(r["Nk"])),
    "ones": ("D", lambda r: int(r["D"])),
    "bwd": ("L (Nq = Nk)", lambda r: int(r["Nk"])),
}
OURS = "dmattn"
OURS_BWD = "dmattn bwd"
# The harness's second forward row: the same forward given the mask's summary
# built beforehand. Ours too, so neither a peer column nor a speed-up curve:
# its own time column and time curve.
OURS_GIVEN = "dmattn (mask summary given)"
# --mask-bits: the same forward and backward on the mask bit-packed. Ours too:
# own time columns, and the peers' speed-up over them.
OURS_BITS = "dmattn (bit-packed mask)"
OURS_BWD_BITS = "dmattn bwd (bit-packed mask)"
OURS_EXTRA = (OURS_GIVEN, OURS_BITS, OURS_BWD_BITS)
DPI = 110
MARKER = re.compile(r"^<!-- dmattn-table: (?P<table>\w+) -->\n.*?^<!-- dmattn-table:end -->$", re.S | re.M)


def is_bwd(variant):
    """A backward row: 'dmattn bwd', 'dmattn bwd (deterministic)', 'sdpa(cudnn)+mask bwd', ..."""
    return re.search(r"\bbwd\b", variant) is not None


def window_of(row):
    m = re.search(r"W=(\d+)", row["note"])
    return int(m.group(1)) if m else 0


def skipped_of(row):
    m = re.search(r"tiles skipped ([\d.]+)%", row["note"])
    return float(m.group(1)) if m else None


def read(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def ran(row):
    return row["time_ms"] not in ("", None)


def series(rows, x_of):
    """{variant: {x: row}} — the last row wins for a repeated (variant, x)."""
    out = {}
    for r in rows:
        out.setdefault(r["variant"], {})[x_of(r)] = r
    return out


def unmasked_share(row):
    """Unmasked pairs / all pairs, from the effective TFLOPS (4·D·pairs / time
    forward, 10·D·pairs / time backward)."""
    if not ran(row) or not row["tflops"]:
        return None
    # Older CSVs wrote TFLOPS with two decimals: at decoding sizes (0.02) that
    # is no number to derive a share from.
    digits = row["tflops"].replace(".", "").lstrip("0")
    if "e" not in row["tflops"] and len(digits) < 3:
        return None
    per_pair = (10 if is_bwd(row["variant"]) else 4) * int(row["D"])
    pairs = float(row["tflops"]) * 1e12 * float(row["time_ms"]) * 1e-3 / per_pair
    return pairs / (int(row["B"]) * int(row["H"]) * int(row["Nq"]) * int(row["Nk"]))


def ours_for(name):
    return OURS_BWD if name == "bwd" else OURS


def only(name, rows):
    """The bwd table shows the backward rows; the others the forward rows."""
    backward = [r for r in rows if is_bwd(r["variant"])]
    return backward if name == "bwd" else [r for r in rows if not is_bwd(r["variant"])]


def plot(name, rows):
    """dmattn_<name>.png as bytes, or None when the rows have no row of ours."""
    label, x_of = TABLES[name]
    ours_name = ours_for(name)
    by = series(only(name, rows), x_of)
    if ours_name not in by:
        return None
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    ours = by[ours_name]
    bits = by.get(OURS_BWD_BITS if name == "bwd" else OURS_BITS, {})
    for variant, pts in by.items():
        xs = sorted(x for x, r in pts.items() if ran(r))
        if not xs:
            continue
        style = "-o" if variant == ours_name else "--s"
        ax_t.plot(xs, [float(pts[x]["time_ms"]) for x in xs], style, label=variant, markersize=4)
        if variant != ours_name and variant not in OURS_EXTRA:
            both = [x for x in xs if x in ours and ran(ours[x])]
            if both:
                line, = ax_s.plot(both, [float(pts[x]["time_ms"]) / float(ours[x]["time_ms"]) for x in both], "-o",
                                  label=f"vs {variant}", markersize=4)
                with_bits = [x for x in xs if x in bits and ran(bits[x])]
                if with_bits:  # the same peer over the bit-packed mask's row: dashed, same colour
                    ax_s.plot(with_bits, [float(pts[x]["time_ms"]) / float(bits[x]["time_ms"]) for x in with_bits],
                              "--^", color=line.get_color(), label=f"vs {variant}, bit-packed mask", markersize=4)
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (ms, median)")
    ax_s.set_ylabel(f"{ours_name} speed-up (peer time / ours)")
    ax_s.axhline(1.0, color="0.5", linewidth=0.8)
    any_row = next(iter(ours.values()))
    fig.suptitle(f"dynamic-mask forward, {name}: {any_row['gpu']}, B={any_row['B']} H={any_row['H']} "
                 f"D={any_row['D']} {any_row['dtype']}{' causal' if any_row['causal'] == '1' else ''}")
    return generated.png_bytes(fig, DPI)


def table(name, rows):
    label, x_of = TABLES[name]
    ours_name = ours_for(name)
    by = series(only(name, rows), x_of)
    if ours_name not in by:
        return ""
    peers = [v for v in by if v != ours_name and v not in OURS_EXTRA]
    extra = [v for v in OURS_EXTRA if v in by]  # ours again: the summary given, the bit-packed mask
    bits = by.get(OURS_BWD_BITS if name == "bwd" else OURS_BITS, {})
    head = ([label, "unmasked pairs", "tiles skipped", f"{ours_name} ms"] + [f"{v} ms" for v in extra] +
            [f"{p} ms (speed-up{'; over the bit-packed mask' if bits else ''})" for p in peers])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for x in sorted(by[ours_name]):
        r = by[ours_name][x]
        share = unmasked_share(r)
        skipped = skipped_of(r)
        cells = [str(x), f"{100 * share:.2f}%" if share is not None else "–",
                 f"{skipped:.1f}%" if skipped is not None else "–",
                 f"{float(r['time_ms']):.4f}" if ran(r) else r["status"]]
        for v in extra:
            g = by[v].get(x)
            cells.append(f"{float(g['time_ms']):.4f}" if g is not None and ran(g) else "–")
        for p in peers:
            pr = by[p].get(x)
            if pr is not None and ran(pr) and ran(r):
                cell = f"{float(pr['time_ms']):.4f} ({float(pr['time_ms']) / float(r['time_ms']):.2f}x"
                b = bits.get(x)
                if b is not None and ran(b):
                    cell += f"; {float(pr['time_ms']) / float(b['time_ms']):.2f}x"
                cells.append(cell + ")")
            else:
                cells.append("–")
        lines.append("| " + " | ".join(cells) + " |")
    commits = sorted({r["commit"] for r in rows})
    lines += ["", f"Commit {', '.join(rc.commit_label(c) for c in commits)}; {rows[0]['gpu']}; peers in the same process."]
    return "\n".join(lines)


def found(folder):
    """The tables whose CSV `folder` has, in TABLES order."""
    return [n for n in TABLES if os.path.exists(os.path.join(folder, f"{n}.csv"))]


def render(folder):
    """{file name: bytes}: dmattn_<table>.png for each table with rows of ours, and summary.md."""
    files = {}
    md = ["# Dynamic-mask attention tables", "",
          "Generated by `scripts/plot_dmattn.py` from the CSVs of `scripts/dmattn_tables`.", ""]
    for name in found(folder):
        rows = read(os.path.join(folder, f"{name}.csv"))
        png = plot(name, rows)
        if png is not None:
            files[f"dmattn_{name}.png"] = png
            md += [f"### {name}", "", table(name, rows), "", f"![{name}](dmattn_{name}.png)", ""]
    files["summary.md"] = "\n".join(md).encode("utf-8")
    return files


def fill(text, folder, where):
    """`text` with every dmattn block filled with that table of `folder` (a sentence when it has none)."""
    def one(m):
        name = m.group("table")
        path = os.path.join(folder, f"{name}.csv")
        if name not in TABLES:
            raise ValueError(f"{where}: no dynamic-mask table '{name}' (tables: {', '.join(TABLES)})")
        body = table(name, read(path)) if os.path.exists(path) else ""
        body = body or f"No rows of this table in the results yet (scripts/dmattn_tables writes {name}.csv)."
        return m.group(0).split("\n", 1)[0] + "\n" + body + "\n<!-- dmattn-table:end -->"
    return MARKER.sub(one, text)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="results/<gpu>/dmattn")
    args = p.parse_args(argv)
    if not found(args.folder):
        print(f"plot_dmattn.py: error: no {', '.join(f'{n}.csv' for n in TABLES)} in {args.folder}",
              file=sys.stderr)
        return 2
    try:
        rc.load_gone_commits(os.path.dirname(os.path.dirname(os.path.abspath(args.folder))))
    except rc.CsvError as e:
        print(f"plot_dmattn.py: error: {e}", file=sys.stderr)
        return 2
    for name, data in render(args.folder).items():
        path = os.path.join(args.folder, name)
        generated.write_if_changed(path, data)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
