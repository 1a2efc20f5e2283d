"""Plot one GPU's forward results and write the README's results table.

    python3 scripts/plot.py results/H200 [--out DIR] [--readme README.md]

Reads the forward CSVs of the GPU folder (fwd.csv and bench.csv, merged by
results_csv.load_gpu: for each variant and shape the newest row) and writes,
into --out (default: the folder):

  fwd_tflops_vs_N.png     TFLOPS against N, one panel per (causal, D)
  fwd_tflops_vs_D.png     TFLOPS against D at N = 8192 (else the largest N)
  fwd_ratio_heatmap.png   best rung / best peer over (N, D), one panel per causal;
                          each cell names its best rung

The plots show square shapes (Nq = Nk, D = Dv) with the most common (B, H), in
fp16 when the rows have it: every variant with a timed row there, none left
out. A row counts when it has a time and its check did not FAIL. Colours
follow the rung's family (FAMILY_COLORMAPS, docs/results.md); a point with no
timed neighbour on its curve (a variant timed at one N only) is a larger
marker with no line. With --readme, the text between <!-- results:begin -->
and <!-- results:end --> in that file is replaced by a table at N = 8192 and
links to the plots (scripts/regenerate.py does the same for the README).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generated  # noqa: E402
import ladder  # noqa: E402
import results_csv as rc  # noqa: E402

DPI = 110
VS_N, VS_D, HEATMAP = "fwd_tflops_vs_N.png", "fwd_tflops_vs_D.png", "fwd_ratio_heatmap.png"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
RATIO_SPREAD = 2.0  # the heat map's color scale runs from 1/RATIO_SPREAD to RATIO_SPREAD
MISSING_COLOR = "0.88"

# The colour rule: one colour map per rung family, a rung's shade fixed by its place in the
# family (darker = later rung), so a rung has the same colour in every plot and on every GPU.
FAMILY_COLORMAPS = {ladder.MMA: "Blues", ladder.HOPPER: "Greens", ladder.SPLIT_D: "Purples",
                    ladder.TWO_PASS: "Oranges"}
FAMILY_COLOR_NAMES = {"Blues": "blue", "Greens": "green", "Purples": "purple", "Oranges": "orange"}
OTHER_COLORMAP = "YlOrBr"  # a rung whose name ladder.RUNGS does not know
RUNG_MARKERS = "osD^vPX*"  # by the rung's place in its family
STAGE_STYLES = (("-", "full"), ("-.", "none"), (":", "top"))  # line and marker fill by the variant's place
                                                              # among its rung's variants
# Peers: greys and black, dashed.
PEER_STYLES = {"sdpa(cudnn)": ("0.0", "*"), "sdpa(flash)": ("0.3", "P"), "sdpa(efficient)": ("0.55", "X"),
               "unfused": ("0.15", "x"), "torch(unfused)": ("0.6", "+")}
OTHER_PEER_STYLE = ("0.45", ".")
POINT_SIZE, LONE_POINT_SIZE = 4, 7


class ReadmeError(Exception):
    """A README that cannot be read or has no results markers."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a GPU's results folder, e.g. results/H200")
    p.add_argument("--out", help="folder for the PNGs (default: the GPU folder)")
    p.add_argument("--readme", help="markdown file whose results block to regenerate")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        rc.load_gone_commits(os.path.dirname(os.path.abspath(args.folder)))
        rows = rc.load_gpu(args.folder)
        readme = read_readme(args.readme) if args.readme else None
    except (rc.CsvError, ReadmeError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2
    out = args.out or args.folder
    os.makedirs(out, exist_ok=True)
    images = {}
    for name, data in render(rows).items():
        path = os.path.join(out, name)
        generated.write_if_changed(path, data)
        images[name] = path
        print(f"wrote {path}")
    if readme is not None:
        readme_dir = os.path.dirname(os.path.abspath(args.readme))
        block = results_block(rows, rc.forward_csvs(args.folder), images, readme_dir)
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(generated.replace_block(readme, BEGIN, END, block, args.readme))
        print(f"wrote {args.readme}")
    return 0


def read_readme(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ReadmeError(f"cannot read {path}: {e.strerror}") from None
    try:
        found = generated.replace_block(text, BEGIN, END, "", path) is not None
    except generated.BlockError as e:
        raise ReadmeError(str(e)) from None
    if not found:
        raise ReadmeError(f"{path} has no '{BEGIN}' ... '{END}' markers to replace")
    return text


# ---- plots ----------------------------------------------------------------------


def render(rows):
    """{file name: PNG bytes} of every plot that has data (none when no square shape ran)."""
    sl = rc.forward_slice(rows)
    if sl is None or not any(rc.ran(r) for r in sl.rows):
        print("skipped all plots: no forward rows with Nq = Nk that ran")
        return {}
    styles = variant_styles(sl)
    images = {}
    for name, draw in ((VS_N, plot_vs_n), (VS_D, plot_vs_d), (HEATMAP, plot_ratio_heatmap)):
        fig = draw(sl, styles)
        if fig is None:
            print(f"skipped {name}: no data for it")
            continue
        images[name] = generated.png_bytes(fig, DPI)
    return images


def family_shades(family):
    """{rung number: (colour map value, marker)} for the rungs of `family`, in ladder order."""
    numbers = [r.number for r in ladder.RUNGS if r.family == family]
    n = len(numbers)
    return {num: (0.75 if n == 1 else 0.55 + 0.4 * i / (n - 1), RUNG_MARKERS[i % len(RUNG_MARKERS)])
            for i, num in enumerate(numbers)}


def rung_order(variant):
    rung = ladder.rung_of(variant)
    return (rung.number if rung else "~", variant)


def variant_styles(sl):
    """{variant: plot style} for every variant that ran, in legend order: peers, then rungs by number."""
    ran = {r["variant"] for r in sl.rows if rc.ran(r)}
    styles = {}
    for name in (v for v in rc.variants(sl.rows, rc.PEER) if v in ran):
        color, marker = PEER_STYLES.get(name, OTHER_PEER_STYLE)
        styles[name] = dict(color=color, marker=marker, linestyle="--", fillstyle="full")
    rungs = sorted((v for v in rc.variants(sl.rows, rc.RUNG) if v in ran), key=rung_order)
    unknown = [v for v in rungs if ladder.rung_of(v) is None]
    for name in rungs:
        rung = ladder.rung_of(name)
        if rung is None:
            color = plt.get_cmap(OTHER_COLORMAP)(0.55 + 0.4 * unknown.index(name) / max(len(unknown) - 1, 1))
            marker, stage = "o", 0
        else:
            shade, marker = family_shades(rung.family)[rung.number]
            color = plt.get_cmap(FAMILY_COLORMAPS[rung.family])(shade)
            siblings = [v for v in rungs if ladder.rung_of(v) == rung]
            stage = siblings.index(name)
        linestyle, fill = STAGE_STYLES[stage % len(STAGE_STYLES)]
        styles[name] = dict(color=color, marker=marker, linestyle=linestyle, fillstyle=fill)
    return styles


def colour_rule():
    """The legend's title: what the colours and markers mean."""
    lines = ["peers: grey, dashed"]
    for family in ladder.FAMILIES:
        numbers = [r.number for r in ladder.RUNGS if r.family == family]
        span = numbers[0] if len(numbers) == 1 else (
            f"{numbers[0]}–{numbers[-1]}" if int(numbers[-1]) - int(numbers[0]) == len(numbers) - 1
            else ", ".join(numbers))
        word = "rung" if len(numbers) == 1 else "rungs"
        lines.append(f"{word} {span} ({family}): {FAMILY_COLOR_NAMES[FAMILY_COLORMAPS[family]]}")
    lines.append("big marker, no line: timed there only")
    return "\n".join(lines)


def causal_name(causal):
    return "causal" if causal else "non-causal"


def n_label(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def tflops_at(rows, variant, column, key):
    """TFLOPS of `variant` in the row whose `column` is `key`, NaN when it did not run."""
    value = rc.tflops([r for r in rows if r[column] == key], variant)
    return np.nan if value is None else value


class Drawn:
    """What a figure drew of each variant: whether as a line anywhere, and where lone points."""

    def __init__(self):
        self.line, self.lone = set(), {}

    def add(self, variant, as_line, lone_labels):
        if as_line:
            self.line.add(variant)
        self.lone.setdefault(variant, set()).update(lone_labels)

    def __contains__(self, variant):
        return variant in self.line or variant in self.lone

    def __len__(self):
        return len(self.lone)


def lone_style(style):
    """A point with no timed neighbour: the variant's marker, larger, edged, without a line."""
    hollow = style["fillstyle"] == "none"
    return dict(color=style["color"], marker=style["marker"], fillstyle=style["fillstyle"], linestyle="none",
                markersize=LONE_POINT_SIZE, markeredgecolor=style["color"] if hollow else "black",
                markeredgewidth=1.5 if hollow else 0.6)


def draw_lines(ax, rows, column, keys, xs, labels, styles, drawn):
    """One curve per variant over `keys` of `column`, drawn at `xs`; a point without a timed
    neighbour gets a larger marker of its own, so a variant timed once is seen as a point."""
    any_drawn = False
    for variant, style in styles.items():
        ys = np.array([tflops_at(rows, variant, column, k) for k in keys], dtype=float)
        have = ~np.isnan(ys)
        if not have.any():
            continue
        any_drawn = True
        ax.plot(xs, ys, label=variant, markersize=POINT_SIZE, linewidth=1.5, **style)
        lone = [i for i in range(len(ys)) if have[i] and not (i > 0 and have[i - 1])
                and not (i + 1 < len(ys) and have[i + 1])]
        if lone:
            ax.plot([xs[i] for i in lone], ys[lone], **lone_style(style))
        drawn.add(variant, len(lone) < have.sum(), [labels[i] for i in lone])
    if not any_drawn:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
    ax.grid(True, alpha=0.3)


def legend_columns(n_entries):
    return 1 if n_entries <= 14 else 2


def legend_height(n_entries):
    """Inches a legend of n entries and the colour rule need (so a short figure does not clip it)."""
    return 0.2 * -(-n_entries // legend_columns(n_entries)) + 0.2 * colour_rule().count("\n") + 1.0


def add_legend(fig, styles, drawn):
    handles = []
    for variant, style in styles.items():
        if variant not in drawn:
            continue
        if variant in drawn.line:
            handles.append(Line2D([], [], label=variant, markersize=5, **style))
        else:  # only lone points: a marker alone, and where it was timed
            where = sorted(drawn.lone[variant], key=lambda s: (len(s), s))
            label = f"{variant} ({', '.join(where)} only)" if len(where) <= 2 else variant
            handles.append(Line2D([], [], label=label, **lone_style(style)))
    legend = fig.legend(handles=handles, loc="outside right center", fontsize=8, title=colour_rule(),
                        title_fontsize=8, ncol=legend_columns(len(handles)))
    legend.get_title().set_multialignment("left")


def plot_vs_n(sl, styles):
    causals, ds, ns = sl.values("causal"), sl.values("D"), sl.values("Nq")
    fig, axes = plt.subplots(len(causals), len(ds),
                             figsize=(3.4 * len(ds) + 2.6, max(2.9 * len(causals) + 0.6, legend_height(len(styles)))),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    ticks = [2**k for k in range(31) if ns[0] <= 2**k <= ns[-1]] or ns
    drawn = Drawn()
    for i, causal in enumerate(causals):
        for j, d in enumerate(ds):
            ax = axes[i][j]
            draw_lines(ax, sl.at(causal=causal, D=d), "Nq", ns, ns, [f"N={n_label(n)}" for n in ns], styles, drawn)
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
    fig, axes = plt.subplots(1, len(causals), figsize=(4.2 * len(causals) + 2.6, max(3.6, legend_height(len(styles)))),
                             sharey=True, squeeze=False, layout="constrained")
    drawn = Drawn()
    for ax, causal in zip(axes[0], causals):
        draw_lines(ax, sl.at(causal=causal, Nq=n), "D", ds, range(len(ds)), [f"D={d}" for d in ds], styles, drawn)
        ax.set_title(causal_name(causal), fontsize=10)
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_xlabel("D")
    axes[0][0].set_ylabel("TFLOPS")
    axes[0][0].set_ylim(bottom=0)
    if not len(drawn):
        plt.close(fig)
        return None
    fig.suptitle(f"Forward TFLOPS vs D at N={n_label(n)} — {gpu_title(sl)}")
    add_legend(fig, styles, drawn)
    return fig


def best_rung_label(rows):
    row = rc.best(rows, rc.RUNG)
    if row is None:
        return ""
    rung = ladder.rung_of(row["variant"])
    return f"rung {rung.number}" if rung else row["variant"]


def coverage_note(sl, ns):
    """'rungs 09, 10, 11: rows at N=8K only' for the rungs without rows at every N of the slice."""
    by_rung = {}
    for r in sl.rows:
        rung = ladder.rung_of(r["variant"])
        if r["kind"] == rc.RUNG and rung is not None:
            by_rung.setdefault(rung.number, set()).add(r["Nq"])
    groups = {}
    for number, have in sorted(by_rung.items()):
        if have != set(ns):
            groups.setdefault(tuple(sorted(have)), []).append(number)
    parts = [f"{'rung' if len(nums) == 1 else 'rungs'} {', '.join(nums)}: rows at "
             f"{', '.join(f'N={n_label(n)}' for n in have)} only" for have, nums in sorted(groups.items())]
    if not parts:
        return None
    return "; ".join(parts) + " (elsewhere a cell shows the best of the rungs that have rows there)"


def ratio_grid(sl, causal, ns, ds):
    """(best rung / best peer, best rung's label) for each (N, D); NaN and '' where either is missing."""
    values = np.full((len(ns), len(ds)), np.nan)
    labels = [["" for _ in ds] for _ in ns]
    for i, n in enumerate(ns):
        for j, d in enumerate(ds):
            rows = sl.at(causal=causal, Nq=n, D=d)
            value = rc.best_ratio(rows)
            if value is not None:
                values[i, j], labels[i][j] = value, best_rung_label(rows)
    return values, labels


def plot_ratio_heatmap(sl, styles=None):
    causals, ds, ns = sl.values("causal"), sl.values("D"), sl.values("Nq")
    grids = [ratio_grid(sl, c, ns, ds) for c in causals]
    if all(np.isnan(values).all() for values, _ in grids):
        return None
    # A fixed scale, the same for every GPU: white at 1, saturated at 0.5x and 2x.
    norm = TwoSlopeNorm(vmin=1 / RATIO_SPREAD, vcenter=1.0, vmax=RATIO_SPREAD)
    fig, axes = plt.subplots(1, len(causals), figsize=(1.1 * len(ds) * len(causals) + 2.4, 0.7 * len(ns) + 2.0),
                             squeeze=False, layout="constrained")
    for ax, causal, (values, labels) in zip(axes[0], causals, grids):
        image = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", norm=norm, aspect="auto")
        ax.set_facecolor(MISSING_COLOR)  # shows through the masked (missing) cells
        for (i, j), value in np.ndenumerate(values):
            if not np.isnan(value):
                dark = abs(norm(value) - 0.5) > 0.3
                ax.text(j, i, f"{value:.2f}\n{labels[i][j]}", ha="center", va="center", fontsize=8,
                        color="white" if dark else "black", linespacing=1.1)
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_yticks(range(len(ns)), [n_label(n) for n in ns])
        ax.set_xlabel("D")
        ax.set_ylabel("N")
        ax.set_title(causal_name(causal), fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label="best rung / best peer (grey: missing)", extend="both")
    fig.suptitle(f"Best rung / best peer TFLOPS, and the best rung — {gpu_title(sl)}")
    note = coverage_note(sl, ns)
    if note:
        fig.supxlabel(note, fontsize=8)
    return fig


def gpu_title(sl):
    gpus, _, _ = rc.provenance(sl.rows)
    return f"{gpus}, {sl.describe()}"


# ---- README block ---------------------------------------------------------------


def results_block(rows, csv_paths, images, readme_dir):
    """The markdown that goes between the results markers; `images` maps plot names to paths."""
    sl = rc.forward_slice(rows)
    sources = ", ".join(f"`{rc.posix_relpath(p, readme_dir)}`" for p in csv_paths)
    gpus, commits, dates = rc.provenance(sl.rows if sl else rows)
    lines = ["<!-- generated by scripts/regenerate.py; edit the CSVs, not this block -->",
             f"Source: {sources} (merged: the newest row of each variant and shape) · GPU: {gpus} · "
             f"commit: {commits} · date: {dates}", ""]
    lines += results_table(sl) if sl else ["No forward rows with Nq = Nk in the CSVs."]
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
