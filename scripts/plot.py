"""Plot one GPU's forward results and write the README's results table.

    python3 scripts/plot.py results/H200 [--out DIR] [--readme README.md]

Reads the forward CSVs of the GPU folder (fwd.csv and bench.csv, merged by
results_csv.load_gpu: for each variant and shape the newest row) and writes,
into --out (default: the folder):

  fwd_main_path.png          the main path (ladder.MAIN_PATH) at ladder.SHAPE as bars, non-causal
                             and causal side by side: each rung's best stage and every variant of
                             the engine (rung 12), FlashAttention-2 and cuDNN as lines
  fwd_tflops_vs_N.png        TFLOPS against N, one panel per (causal, D): the main path and the peers
  fwd_tflops_vs_N_side.png   the same of the side branches (the other forward rungs) and the peers
  fwd_tflops_vs_D.png        TFLOPS against D at N = 8192 (else the largest N): main path and peers
  fwd_tflops_vs_D_side.png   the same of the side branches and the peers
  fwd_ratio_heatmap.png      best rung / best peer over (N, D), one panel per causal; each cell
                             names the best of the rungs that have a row there, and is hatched
                             where a rung that is the best at another N of its D has none

The line plots and the heat map show square shapes (Nq = Nk, D = Dv) with the
most common (B, H), in fp16 when the rows have it: every variant with a timed
row there, in one of the two line plots of each kind, none left out. A row
counts when it has a time and its check did not FAIL. Colours follow the
rung's family (FAMILY_COLORMAPS, docs/results.md); a point with no timed
neighbour on its curve (a variant timed at one N only) is a larger marker with
no line. Every plot names the runs (commit, day) its rows come from: where
they come from more than one, the runs are lettered (results_csv.run_names)
and each bar, heat-map cell and table row carries its letters. With --readme,
the text between <!-- results:begin --> and <!-- results:end --> in that file
is replaced by a table at N = 8192 and links to the plots
(scripts/regenerate.py does the same for the README).
Exits 2, with one line on stderr, on an unreadable CSV or missing markers.
"""
import argparse
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generated  # noqa: E402
import ladder  # noqa: E402
import results_csv as rc  # noqa: E402

DPI = 110
VS_N, VS_D, HEATMAP = "fwd_tflops_vs_N.png", "fwd_tflops_vs_D.png", "fwd_ratio_heatmap.png"
VS_N_SIDE, VS_D_SIDE = "fwd_tflops_vs_N_side.png", "fwd_tflops_vs_D_side.png"
MAIN_PATH_BARS = "fwd_main_path.png"
RESULTS_PLOTS = (VS_N, VS_N_SIDE, VS_D, VS_D_SIDE, HEATMAP)  # the results block links these, in this order
MAIN_PATH, SIDE = "main path", "side branches"
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
    names = rc.run_names(rows)
    styles = variant_styles(sl)
    main, side = split_styles(sl, styles)
    images = {}
    for name, draw in ((MAIN_PATH_BARS, lambda: plot_main_path(rows, names)),
                       (VS_N, lambda: plot_vs_n(sl, main, MAIN_PATH, names)),
                       (VS_N_SIDE, lambda: plot_vs_n(sl, side, SIDE, names)),
                       (VS_D, lambda: plot_vs_d(sl, main, MAIN_PATH, names)),
                       (VS_D_SIDE, lambda: plot_vs_d(sl, side, SIDE, names)),
                       (HEATMAP, lambda: plot_ratio_heatmap(sl, names=names))):
        fig = draw()
        if fig is None:
            print(f"skipped {name}: no data for it")
            continue
        images[name] = generated.png_bytes(fig, DPI)
    return images


def split_styles(sl, styles):
    """(main path's styles, side branches' styles): each the peers and its own rungs' variants."""
    peers = {r["variant"] for r in sl.rows if r["kind"] == rc.PEER}
    main = {v: s for v, s in styles.items() if v in peers or ladder.on_main_path(v)}
    side = {v: s for v, s in styles.items() if v in peers or not ladder.on_main_path(v)}
    return main, side


def family_shades(family):
    """{rung number: (colour map value, marker)} for the rungs of `family`, in ladder order."""
    numbers = [r.number for r in ladder.RUNGS if r.family == family]
    n = len(numbers)
    return {num: (0.75 if n == 1 else 0.55 + 0.4 * i / (n - 1), RUNG_MARKERS[i % len(RUNG_MARKERS)])
            for i, num in enumerate(numbers)}


def rung_color(rung):
    """The colour of a rung known to ladder.RUNGS: its family's map at its shade."""
    shade, _ = family_shades(rung.family)[rung.number]
    return plt.get_cmap(FAMILY_COLORMAPS[rung.family])(shade)


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
            _, marker = family_shades(rung.family)[rung.number]
            color = rung_color(rung)
            siblings = [v for v in rungs if ladder.rung_of(v) == rung]
            stage = siblings.index(name)
        linestyle, fill = STAGE_STYLES[stage % len(STAGE_STYLES)]
        styles[name] = dict(color=color, marker=marker, linestyle=linestyle, fillstyle=fill)
    return styles


def colour_rule(variants=None):
    """The legend's title: what the colours and markers mean, for the rungs of `variants` (all: None)."""
    shown = None if variants is None else {ladder.rung_of(v).number for v in variants if ladder.rung_of(v)}
    lines = ["peers: grey, dashed"]
    for family in ladder.FAMILIES:
        numbers = [r.number for r in ladder.RUNGS if r.family == family and (shown is None or r.number in shown)]
        if not numbers:
            continue
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


def legend_height(n_entries, rule):
    """Inches a legend of n entries under the colour rule `rule` needs (so a short figure does not clip it)."""
    return 0.2 * -(-n_entries // legend_columns(n_entries)) + 0.2 * rule.count("\n") + 1.0


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
    legend = fig.legend(handles=handles, loc="outside right center", fontsize=8,
                        title=colour_rule([v for v in styles if v in drawn]), title_fontsize=8,
                        ncol=legend_columns(len(handles)))
    legend.get_title().set_multialignment("left")


def rungs_in(styles, rows):
    """The rung variants of `styles` with a timed row among `rows`."""
    return {r["variant"] for r in rows if r["variant"] in styles and r["kind"] == rc.RUNG and rc.ran(r)}


def part_title(part, styles, sl):
    """' — main path (rungs 00, 01, 02, 07, 12) and the peers' for the rungs `styles` draws; '' without a part."""
    if part is None:
        return ""
    numbers = sorted({ladder.rung_of(v).number for v in styles if ladder.rung_of(v)})
    others = sorted(v for v in rungs_in(styles, sl.rows) if ladder.rung_of(v) is None)
    return f" — {part} (rungs {', '.join(numbers + others)}) and the peers" if numbers or others else f" — {part}"


def runs_note(rows, names, column=None, fmt=str):
    """Which runs the drawn `rows` come from, for a figure's caption; with `column`, where each was timed:
    'Rows of 3 runs (...): a = commit ..., 2026-11-29, at every N; ...'."""
    drawn = [r for r in rows if rc.ran(r)]
    keys = [k for k in names if any(rc.run_key(r) == k for r in drawn)]
    if len(keys) <= 1:
        return f"One run: {rc.describe_run(keys[0])}." if keys else ""
    every = sorted({r[column] for r in drawn}) if column else []
    parts = []
    for key in keys:
        where = ""
        if column:
            have = sorted({r[column] for r in drawn if rc.run_key(r) == key})
            label = "N" if column == "Nq" else column
            where = f", at every {label}" if have == every else f", at {label}={', '.join(fmt(v) for v in have)}"
        parts.append(f"{names[key]} = {rc.describe_run(key)}{where}")
    return (f"Rows of {len(keys)} runs (for each variant and shape the newest row): " + "; ".join(parts) + ".")


def add_caption(fig, text, width_in):
    """`text` under the figure, wrapped to its width (about 15 characters per inch at 8 points)."""
    if text:
        fig.supxlabel("\n".join(textwrap.wrap(text, max(40, int(width_in * 15)))), fontsize=8, ha="center")


MAX_COLUMNS = 3  # panels per row of the vs-N plots: more head dims wrap to another row


def plot_vs_n(sl, styles, part=None, names=None):
    """TFLOPS against N, a panel per (causal, D); with `part`, only the D where its rungs have a timed row.
    The head dims wrap into rows of at most MAX_COLUMNS panels, non-causal rows above causal ones."""
    ds_with = sorted({r["D"] for r in sl.rows if r["variant"] in rungs_in(styles, sl.rows) and rc.ran(r)})
    if part is not None and not ds_with:
        return None
    causals, ns = sl.values("causal"), sl.values("Nq")
    ds = ds_with if part is not None else sl.values("D")
    per_causal = -(-len(ds) // MAX_COLUMNS)
    cols = -(-len(ds) // per_causal)
    rule = colour_rule(list(styles))
    width = 3.8 * cols + 3.0
    fig, axes = plt.subplots(len(causals) * per_causal, cols,
                             figsize=(width, max(3.2 * len(causals) * per_causal + 1.0,
                                                 legend_height(len(styles), rule))),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    ticks = [2**k for k in range(31) if ns[0] <= 2**k <= ns[-1]] or ns
    drawn = Drawn()
    for c, causal in enumerate(causals):
        for k in range(per_causal * cols):
            ax = axes[c * per_causal + k // cols][k % cols]
            if k >= len(ds):
                ax.set_visible(False)
                continue
            d = ds[k]
            draw_lines(ax, sl.at(causal=causal, D=d), "Nq", ns, ns, [f"N={n_label(n)}" for n in ns], styles, drawn)
            ax.set_title(f"D={d}, {causal_name(causal)}", fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [n_label(t) for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.tick_params(labelbottom=True)
            if k % cols == 0:
                ax.set_ylabel("TFLOPS")
    for ax in axes[-1]:
        ax.set_xlabel("N (Nq = Nk)")
    axes[0][0].set_ylim(bottom=0)
    fig.suptitle(f"Forward TFLOPS vs N{part_title(part, styles, sl)}\n{gpu_title(sl)}")
    add_legend(fig, styles, drawn)
    if names:
        shown = [r for r in sl.rows if r["variant"] in styles and r["D"] in ds]
        add_caption(fig, runs_note(shown, names, "Nq", n_label), width)
    return fig


def plot_vs_d(sl, styles, part=None, names=None):
    n = rc.preferred_n(sl.values("Nq"))
    causals, ds = sl.values("causal"), sl.values("D")
    rule = colour_rule(list(styles))
    width = 4.6 * len(causals) + 3.0
    fig, axes = plt.subplots(1, len(causals), figsize=(width, max(4.0, legend_height(len(styles), rule))),
                             sharey=True, squeeze=False, layout="constrained")
    drawn = Drawn()
    for ax, causal in zip(axes[0], causals):
        draw_lines(ax, sl.at(causal=causal, Nq=n), "D", ds, range(len(ds)), [f"D={d}" for d in ds], styles, drawn)
        ax.set_title(causal_name(causal), fontsize=10)
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_xlabel("D")
    axes[0][0].set_ylabel("TFLOPS")
    axes[0][0].set_ylim(bottom=0)
    if not len(drawn) or (part is not None and not rungs_in(styles, sl.at(Nq=n))):
        plt.close(fig)
        return None
    fig.suptitle(f"Forward TFLOPS vs D at N={n_label(n)}{part_title(part, styles, sl)}\n{gpu_title(sl)}")
    add_legend(fig, styles, drawn)
    if names:
        add_caption(fig, runs_note([r for r in sl.at(Nq=n) if r["variant"] in styles], names, "D"), width)
    return fig


# ---- the main path as bars --------------------------------------------------------


def at_shape(rows, causal):
    """The rows at ladder.SHAPE with `causal` (every head its own K/V: no GQA row)."""
    shape = dict(ladder.SHAPE, causal=causal)
    return [r for r in rows if all(r[k] == v for k, v in shape.items()) and r["Hkv"] == r["H"]]


def main_path_bars(rows, causal):
    """[(rung, row or None, why not or None)] at ladder.SHAPE with `causal`: each main-path rung's best
    stage, then every variant of the engine (ladder.ENGINE) that has a row there, in the order of the rows."""
    at = at_shape(rows, causal)
    bars = []
    for number in ladder.MAIN_PATH:
        rung = ladder.BY_NUMBER[number]
        if number != ladder.ENGINE:
            row = ladder.best_stage(at, rung)
            bars.append((rung, row, None if row else ladder.why_not(at, rows, rung)))
            continue
        mine = [r for r in at if r["kind"] == rc.RUNG and ladder.is_variant_of(r["variant"], rung.prefix)]
        bars += [(rung, r, None if rc.ran(r) else r["status"]) for r in mine]
        if not mine:
            bars.append((rung, None, ladder.why_not(at, rows, rung)))
    return bars


# The bar chart's reference lines: (peer, label, colour, dash pattern).
PEER_LINES = ((ladder.FA2, "FA2 (sdpa flash)", "0.45", (0, (5, 3))),
              (ladder.CUDNN, "cuDNN (sdpa cudnn)", "0.0", (0, (2, 2))))


def plot_main_path(rows, names):
    """Bars of the main path at ladder.SHAPE, one panel per causal that has rows there; None without any."""
    panels = [(c, main_path_bars(rows, c)) for c in (0, 1) if at_shape(rows, c)]
    panels = [(c, bars) for c, bars in panels if any(row is not None and rc.ran(row) for _, row, _ in bars)]
    if not panels:
        return None
    used = [row for c, bars in panels for _, row, _ in bars if row is not None and rc.ran(row)]
    used += [r for c, _ in panels for r in at_shape(rows, c)
             if r["variant"] in (ladder.FA2, ladder.CUDNN) and rc.ran(r)]
    several = len({rc.run_key(r) for r in used}) > 1
    top = max(r["tflops"] for r in used)
    width = 1.15 * max(len(bars) for _, bars in panels) * len(panels) + 1.6
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 5.2), sharey=True, squeeze=False, layout="constrained")
    for ax, (causal, bars) in zip(axes[0], panels):
        labels = []
        for x, (rung, row, reason) in enumerate(bars):
            label = f"{rung.number} {rung.prefix}"
            if row is not None and ladder.stage_of(row["variant"], rung):
                label += "\n" + ladder.stage_of(row["variant"], rung)
            if row is not None and rc.ran(row):
                ax.bar(x, row["tflops"], width=0.7, color=rung_color(rung), edgecolor="0.2", linewidth=0.6)
                ax.text(x, row["tflops"] + top * 0.01, f"{row['tflops']:.1f}", ha="center", va="bottom", fontsize=8,
                        zorder=5, bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
                if several:
                    label += f"\nrun {names[rc.run_key(row)]}"
            else:
                ax.text(x, top * 0.02, "\n".join(textwrap.wrap(f"not timed: {reason}", 14)), ha="center",
                        va="bottom", fontsize=7, color="0.35")
            labels.append(label)
        at = at_shape(rows, causal)
        for name, text, color, dashes in PEER_LINES:
            peer = next((r for r in at if r["variant"] == name and rc.ran(r)), None)
            if peer is None:
                continue
            ax.axhline(peer["tflops"], color=color, linestyle=dashes, linewidth=1.3, zorder=3)
            run = f", run {names[rc.run_key(peer)]}" if several else ""
            ax.text(-0.45, peer["tflops"] + top * 0.01, f"{text}: {peer['tflops']:.1f}{run}", ha="left",
                    va="bottom", fontsize=8, color=color, zorder=4,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5))
        ax.set_xticks(range(len(bars)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(bars) - 0.4)
        ax.set_title(causal_name(causal), fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("TFLOPS")
    axes[0][0].set_ylim(0, top * 1.12)
    s = ladder.SHAPE
    gpus, _, _ = rc.provenance(used)
    fig.suptitle(f"The main path, rung by rung: forward at B={s['B']} H={s['H']} N={s['Nq']} D={s['D']}, "
                 f"{s['dtype']} — {gpus}")
    what = (f"Each rung's best stage (named under its bar) and every variant of rung {ladder.ENGINE}; "
            "colours as in the other plots (blue: mma.sync, green: Hopper). ")
    if several:
        what += "Bars and lines from several runs (letter under each bar and after each line): " + \
            rc.runs_legend({k: v for k, v in names.items() if any(rc.run_key(r) == k for r in used)}) + "."
    else:
        what += f"Bars and lines from one run: {rc.describe_run(rc.run_key(used[0]))}."
    add_caption(fig, what, width)
    return fig


# ---- the heat map -------------------------------------------------------------------


def rung_id(variant):
    """'07' for a variant of a known rung, else the variant's name."""
    rung = ladder.rung_of(variant)
    return rung.number if rung else variant


def best_rung_label(rows):
    row = rc.best(rows, rc.RUNG)
    if row is None:
        return ""
    rung = ladder.rung_of(row["variant"])
    return f"rung {rung.number}" if rung else row["variant"]


class Cell:
    """One heat-map cell: best rung / best peer, the best rung, the runs of those two rows, and the rungs
    that win elsewhere in the cell's column (same D, other N) but have no row here."""

    def __init__(self, value, label, runs, not_run):
        self.value, self.label, self.runs, self.not_run = value, label, runs, not_run


def ratio_grid(sl, causal, ns, ds, names=None):
    """[[Cell or None]] over (N, D): None where the best rung or the best peer is missing.

    A rung is "not run" in a cell when it is the best rung of another cell of the same D (any N, causal
    or not) and has no row at all in this one: the cell's best is then only the best of the rungs that
    ran there.
    """
    grid = [[None for _ in ds] for _ in ns]
    for j, d in enumerate(ds):
        column = [sl.at(causal=causal, Nq=n, D=d) for n in ns]
        winners = sorted({rung_id(b["variant"]) for b in (rc.best(sl.at(Nq=n, D=d, causal=c), rc.RUNG)
                                                          for n in ns for c in sl.values("causal")) if b})
        for i, rows in enumerate(column):
            value = rc.best_ratio(rows)
            if value is None:
                continue
            have = {rung_id(r["variant"]) for r in rows if r["kind"] == rc.RUNG}
            pair = [rc.best(rows, rc.RUNG), rc.best(rows, rc.PEER)]
            grid[i][j] = Cell(value, best_rung_label(rows), rc.runs_label(pair, names, "+") if names else "",
                              [w for w in winners if w not in have])
    return grid


def cell_text(cell, several_runs):
    lines = [f"{cell.value:.2f}", cell.label]
    if cell.not_run:
        lines.append(f"{', '.join(cell.not_run)} not run")
    if several_runs:
        lines.append(f"run {cell.runs}")
    return "\n".join(lines)


def plot_ratio_heatmap(sl, styles=None, names=None):
    causals, ds, ns = sl.values("causal"), sl.values("D"), sl.values("Nq")
    grids = [ratio_grid(sl, c, ns, ds, names) for c in causals]
    if all(cell is None for grid in grids for row in grid for cell in row):
        return None
    shown = [r for c in causals for n in ns for d in ds  # the two rows behind each drawn cell
             for rows in [sl.at(causal=c, Nq=n, D=d)] if rc.best_ratio(rows) is not None
             for r in (rc.best(rows, rc.RUNG), rc.best(rows, rc.PEER))]
    runs = {k: v for k, v in (names or {}).items() if any(rc.run_key(r) == k for r in shown)}
    several = len(runs) > 1
    # A fixed scale, the same for every GPU: white at 1, saturated at 0.5x and 2x.
    norm = TwoSlopeNorm(vmin=1 / RATIO_SPREAD, vcenter=1.0, vmax=RATIO_SPREAD)
    width = 1.2 * len(ds) * len(causals) + 2.4
    fig, axes = plt.subplots(1, len(causals), figsize=(width, (0.95 if several else 0.8) * len(ns) + 2.6),
                             squeeze=False, layout="constrained")
    for ax, causal, grid in zip(axes[0], causals, grids):
        values = np.array([[np.nan if cell is None else cell.value for cell in row] for row in grid], dtype=float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", norm=norm, aspect="auto")
        ax.set_facecolor(MISSING_COLOR)  # shows through the masked (missing) cells
        for i, row in enumerate(grid):
            for j, cell in enumerate(row):
                if cell is None:
                    continue
                dark = abs(norm(cell.value) - 0.5) > 0.3
                if cell.not_run:  # hatched, the text on a patch of the cell's own colour
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", linewidth=0,
                                           edgecolor="0.85" if dark else "0.15", alpha=0.5))
                ax.text(j, i, cell_text(cell, several), ha="center", va="center", fontsize=7.5,
                        color="white" if dark else "black", linespacing=1.1,
                        bbox=dict(facecolor=image.cmap(norm(cell.value)), edgecolor="none", pad=1.5)
                        if cell.not_run else None)
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_yticks(range(len(ns)), [n_label(n) for n in ns])
        ax.set_xlabel("D")
        ax.set_ylabel("N")
        ax.set_title(causal_name(causal), fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label="best rung / best peer (grey: missing)", extend="both")
    fig.suptitle(f"Best rung / best peer TFLOPS, and the best rung — {gpu_title(sl)}")
    note = ("Each cell: the best rung's TFLOPS over the best peer's, among the rows at that (N, D), and that rung"
            + (", then the run(s) of the two rows" if several else "") + ". Hatched, \"12 not run\": a rung that "
            "is the best at another shape of the same D has no row in this cell, so the cell names the best of "
            "the rungs that ran there, not the ladder's best. ")
    note += ("Runs: " + rc.runs_legend(runs) + "." if several else
             f"One run: {rc.describe_run(next(iter(runs)))}." if runs else "")
    add_caption(fig, note, width)
    return fig


def gpu_title(sl):
    gpus, _, _ = rc.provenance(sl.rows)
    return f"{gpus}, {sl.describe()}"


# ---- README block ---------------------------------------------------------------


def results_block(rows, csv_paths, images, readme_dir):
    """The markdown that goes between the results markers; `images` maps plot names to paths."""
    sl = rc.forward_slice(rows)
    sources = ", ".join(f"`{rc.posix_relpath(p, readme_dir)}`" for p in csv_paths)
    gpus, _, _ = rc.provenance(sl.rows if sl else rows)
    lines = ["<!-- generated by scripts/regenerate.py; edit the CSVs, not this block -->",
             f"Source: {sources} (merged: the newest row of each variant and shape) · GPU: {gpus}", ""]
    lines += results_table(sl, rc.run_names(rows)) if sl else ["No forward rows with Nq = Nk in the CSVs."]
    titles = {VS_N: "TFLOPS vs N, main path", VS_N_SIDE: "TFLOPS vs N, side branches",
              VS_D: "TFLOPS vs D, main path", VS_D_SIDE: "TFLOPS vs D, side branches",
              HEATMAP: "best rung / best peer"}
    links = [f"![{titles[name]}]({rc.posix_relpath(images[name], readme_dir)})" for name in RESULTS_PLOTS
             if name in images]
    if links:
        lines += [""] + links
    return "\n".join(lines)


def results_table(sl, names):
    """The table at N = 8192 (else the largest N); with rows of more than one run, a run column
    that names the runs (`names`: results_csv.run_names) of the numbers in each row."""
    n = rc.preferred_n(sl.values("Nq"))
    at_n = sl.at(Nq=n)
    peers = rc.variants(at_n, rc.PEER)
    body, runs = [], []
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
            shown = [r for r in shape if rc.ran(r) and (r is rung or r["kind"] == rc.PEER)]
            body.append(cells)
            runs.append(shown)
    used = {rc.run_key(r) for shown in runs for r in shown}
    several = len(used) > 1
    head = ["D", "causal", "best rung", "TFLOPS", *peers, "ratio to best peer"] + (["run"] if several else [])
    align = ["---:", ":---:", "---", "---:", *["---:"] * len(peers), "---:"] + ([":---:"] if several else [])
    caption = (f"Forward, {sl.describe()}, N={n} (Nq = Nk, D = Dv). TFLOPS; peer columns give each peer's "
               "TFLOPS, – where it did not run; ratio = best rung / best peer. ")
    if several:
        legend = rc.runs_legend({k: v for k, v in names.items() if k in used})
        caption += (f"The rows come from {len(used)} runs, lettered in the run column: {legend}. A row names "
                    "every run its numbers come from; a row of two runs compares numbers measured apart.")
    elif used:
        caption += f"Every row from one run: {rc.describe_run(next(iter(used)))}."
    lines = [caption.rstrip(), "", "| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for cells, shown in zip(body, runs):
        lines.append("| " + " | ".join(cells + ([rc.runs_label(shown, names)] if several else [])) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
