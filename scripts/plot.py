"""Plot forward-pass results and refresh the results table in a README.

    python3 scripts/plot.py results/H200/fwd.csv [more.csv ...] [--out DIR] [--readme README.md]

Reads results CSVs written by flash_attn_mma --csv (the last row of each
(variant, shape) wins) and writes, into --out (default: the first CSV's folder):

  fwd_tflops_vs_N.png     TFLOPS against N, one subplot per (causal, D)
  fwd_tflops_vs_D.png     TFLOPS against D at N = 8192 (else the largest N)
  fwd_ratio_heatmap.png   best rung / best peer over (N, D), one panel per causal

The plots show square shapes (Nq = Nk, D = Dv) with the most common (B, H), in
fp16 when the CSV has it. A row counts when it has a time and its check did
not FAIL. With --readme, the text between <!-- results:begin --> and
<!-- results:end --> in that file is replaced by a table at N = 8192 and links
to the plots; the output depends only on the CSVs, so rerunning gives no diff.
Exits 2, with one line on stderr, on an unreadable CSV or missing markers.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

import results_csv as rc  # noqa: E402

DPI = 110
VS_N, VS_D, HEATMAP = "fwd_tflops_vs_N.png", "fwd_tflops_vs_D.png", "fwd_ratio_heatmap.png"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
MARKERS = "osD^vP*X"
RATIO_SPREAD = 2.0  # the heat map's color scale runs from 1/RATIO_SPREAD to RATIO_SPREAD
MISSING_COLOR = "0.88"


class ReadmeError(Exception):
    """A README that cannot be read or has no results markers."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="+", help="results CSV(s); later rows replace earlier ones")
    p.add_argument("--out", help="folder for the PNGs (default: the first CSV's folder)")
    p.add_argument("--readme", help="markdown file whose results block to regenerate")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        rows = rc.load(args.csv)
        readme = split_readme(args.readme) if args.readme else None
    except (rc.CsvError, ReadmeError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.dirname(args.csv[0]) or "."
    os.makedirs(out, exist_ok=True)
    sl = rc.forward_slice(rows)
    images = write_plots(sl, out)
    if readme:
        head, tail = readme
        readme_dir = os.path.dirname(os.path.abspath(args.readme))
        block = results_block(sl, rows, args.csv, images, readme_dir)
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(f"{head}\n{block}\n{tail}")
        print(f"wrote {args.readme}")
    return 0


# ---- plots ----------------------------------------------------------------------


def write_plots(sl, out):
    """Writes every plot that has data; returns {file name: path} of those written."""
    written = {}
    if sl is None or not any(rc.ran(r) for r in sl.rows):
        print("skipped all plots: no forward rows with Nq = Nk that ran")
        return written
    styles = variant_styles(sl)
    plots = ((VS_N, lambda: plot_vs_n(sl, styles)), (VS_D, lambda: plot_vs_d(sl, styles)),
             (HEATMAP, lambda: plot_ratio_heatmap(sl)))
    for name, draw in plots:
        path = os.path.join(out, name)
        fig = draw()
        if fig is None:
            print(f"skipped {name}: no data for it")
            continue
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        written[name] = path
        print(f"wrote {path}")
    return written


def variant_styles(sl):
    """A fixed color and marker per variant that ran, so every panel agrees; peers dashed, rungs solid."""
    ran = {r["variant"] for r in sl.rows if rc.ran(r)}
    styles = {}
    for kind in (rc.PEER, rc.RUNG):
        for name in (v for v in rc.variants(sl.rows, kind) if v in ran):
            i = len(styles)
            # tab20, then tab20b: 40 distinct colors, and a marker change on top
            palette = plt.cm.tab20 if i % 40 < 20 else plt.cm.tab20b
            styles[name] = dict(color=palette(i % 20), marker=MARKERS[i // 20 % len(MARKERS)],
                                linestyle="--" if kind == rc.PEER else "-")
    return styles


def causal_name(causal):
    return "causal" if causal else "non-causal"


def n_label(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def tflops_at(rows, variant, column, key):
    """TFLOPS of `variant` in the row whose `column` is `key`, NaN when it did not run."""
    value = rc.tflops([r for r in rows if r[column] == key], variant)
    return np.nan if value is None else value


def draw_lines(ax, rows, column, keys, xs, styles):
    """One line per variant over `keys` of `column`, drawn at `xs`; returns the variants drawn."""
    drawn = set()
    for variant, style in styles.items():
        ys = [tflops_at(rows, variant, column, k) for k in keys]
        if all(np.isnan(ys)):
            continue
        ax.plot(xs, ys, label=variant, markersize=4, linewidth=1.5, **style)
        drawn.add(variant)
    if not drawn:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
    ax.grid(True, alpha=0.3)
    return drawn


def legend_columns(n_entries):
    return 1 if n_entries <= 14 else 2


def legend_height(n_entries):
    """Inches a legend of n entries needs (so a short figure does not clip it)."""
    return 0.2 * -(-n_entries // legend_columns(n_entries)) + 0.8


def add_legend(fig, styles, drawn):
    handles = [Line2D([], [], label=v, markersize=5, **s) for v, s in styles.items() if v in drawn]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, title="dashed: peer",
               ncol=legend_columns(len(handles)))


def plot_vs_n(sl, styles):
    causals, ds, ns = sl.values("causal"), sl.values("D"), sl.values("Nq")
    fig, axes = plt.subplots(len(causals), len(ds),
                             figsize=(3.4 * len(ds) + 2.2, max(2.9 * len(causals) + 0.6, legend_height(len(styles)))),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    ticks = [2**k for k in range(31) if ns[0] <= 2**k <= ns[-1]] or ns
    drawn = set()
    for i, causal in enumerate(causals):
        for j, d in enumerate(ds):
            ax = axes[i][j]
            drawn |= draw_lines(ax, sl.at(causal=causal, D=d), "Nq", ns, ns, styles)
            ax.set_title(f"D={d}, {causal_name(causal)}", fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [n_label(t) for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            if i == len(causals) - 1:
                ax.set_xlabel("N (Nq = Nk)")
            if j == 0:
                ax.set_ylabel("TFLOPS")
    axes[0][0].set_ylim(bottom=0)
    fig.suptitle(f"Forward TFLOPS vs N — {gpu_title(sl)}")
    add_legend(fig, styles, drawn)
    return fig


def plot_vs_d(sl, styles):
    n = rc.preferred_n(sl.values("Nq"))
    causals, ds = sl.values("causal"), sl.values("D")
    fig, axes = plt.subplots(1, len(causals), figsize=(4.2 * len(causals) + 2.2, max(3.6, legend_height(len(styles)))),
                             sharey=True, squeeze=False, layout="constrained")
    drawn = set()
    for ax, causal in zip(axes[0], causals):
        drawn |= draw_lines(ax, sl.at(causal=causal, Nq=n), "D", ds, range(len(ds)), styles)
        ax.set_title(causal_name(causal), fontsize=10)
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_xlabel("D")
    axes[0][0].set_ylabel("TFLOPS")
    axes[0][0].set_ylim(bottom=0)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(f"Forward TFLOPS vs D at N={n_label(n)} — {gpu_title(sl)}")
    add_legend(fig, styles, drawn)
    return fig


def ratio_grid(sl, causal, ns, ds):
    """best rung / best peer for each (N, D), NaN where either side is missing."""
    grid = [[rc.best_ratio(sl.at(causal=causal, Nq=n, D=d)) for d in ds] for n in ns]
    return np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)


def plot_ratio_heatmap(sl):
    causals, ds, ns = sl.values("causal"), sl.values("D"), sl.values("Nq")
    grids = [ratio_grid(sl, c, ns, ds) for c in causals]
    if all(np.isnan(g).all() for g in grids):
        return None
    # A fixed scale, the same for every GPU: white at 1, saturated at 0.5x and 2x.
    norm = TwoSlopeNorm(vmin=1 / RATIO_SPREAD, vcenter=1.0, vmax=RATIO_SPREAD)
    fig, axes = plt.subplots(1, len(causals), figsize=(1.1 * len(ds) * len(causals) + 2.4, 0.55 * len(ns) + 1.8),
                             squeeze=False, layout="constrained")
    for ax, causal, grid in zip(axes[0], causals, grids):
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu", norm=norm, aspect="auto")
        ax.set_facecolor(MISSING_COLOR)  # shows through the masked (missing) cells
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                dark = abs(norm(value) - 0.5) > 0.3
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_yticks(range(len(ns)), [n_label(n) for n in ns])
        ax.set_xlabel("D")
        ax.set_ylabel("N")
        ax.set_title(causal_name(causal), fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label="best rung / best peer (grey: missing)", extend="both")
    fig.suptitle(f"Best rung / best peer TFLOPS — {gpu_title(sl)}")
    return fig


def gpu_title(sl):
    gpus, _, _ = rc.provenance(sl.rows)
    return f"{gpus}, {sl.describe()}"


# ---- README block ---------------------------------------------------------------


def split_readme(path):
    """(text up to and including the begin marker, text from the end marker on)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ReadmeError(f"cannot read {path}: {e.strerror}") from None
    begin = text.find(BEGIN)
    end = text.find(END, begin + len(BEGIN)) if begin >= 0 else -1
    if end < 0:
        raise ReadmeError(f"{path} has no '{BEGIN}' ... '{END}' markers to replace")
    return text[: begin + len(BEGIN)], text[end:]


def results_block(sl, rows, csv_paths, images, readme_dir):
    """The markdown that goes between the markers."""
    sources = ", ".join(f"`{rc.posix_relpath(p, readme_dir)}`" for p in csv_paths)
    gpus, commits, dates = rc.provenance(sl.rows if sl else rows)
    lines = ["<!-- generated by scripts/plot.py; edit the CSV, not this block -->",
             f"Source: {sources} · GPU: {gpus} · commit: {commits} · date: {dates}", ""]
    lines += results_table(sl) if sl else ["No forward rows with Nq = Nk in the CSV."]
    titles = {VS_N: "TFLOPS vs N", VS_D: "TFLOPS vs D", HEATMAP: "best rung / best peer"}
    links = [f"![{titles[name]}]({rc.posix_relpath(images[name], readme_dir)})" for name in titles if name in images]
    if links:
        lines += [""] + links
    return "\n".join(lines)


def results_table(sl):
    n = rc.preferred_n(sl.values("Nq"))
    at_n = sl.at(Nq=n)
    peers = rc.variants(at_n, rc.PEER)
    lines = [f"Forward, {sl.describe()}, N={n} (Nq = Nk, D = Dv). TFLOPS; peer columns give each peer's "
             f"TFLOPS, – where it did not run; ratio = best rung / best peer.", "",
             "| " + " | ".join(["D", "causal", "best rung", "TFLOPS", *peers, "ratio to best peer"]) + " |",
             "|" + "|".join(["---:", ":---:", "---", "---:", *["---:"] * len(peers), "---:"]) + "|"]
    for d in sl.values("D"):
        for causal in sl.values("causal"):
            shape = sl.at(Nq=n, D=d, causal=causal)
            if not shape:
                continue
            rung = rc.best(shape, rc.RUNG)
            cells = [str(d), "yes" if causal else "no"]
            cells += [f"`{rung['variant']}`", rc.fmt_tflops(rung["tflops"])] if rung else ["–", "–"]
            cells += [rc.fmt_tflops(rc.tflops(shape, p)) for p in peers]
            cells.append(rc.fmt_ratio(rc.best_ratio(shape)))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
