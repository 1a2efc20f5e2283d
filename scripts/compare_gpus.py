"""Compare results across GPUs, one results/<gpu>/ folder per GPU.

    python3 scripts/compare_gpus.py [--results results] [--out results]

Writes <out>/compare_gpus.md and <out>/compare_gpus.png. The markdown has a
side-by-side table of the forward shapes (for each GPU the best rung's TFLOPS,
the best peer's, their ratio and the best rung's fraction of the card's GEMM
ceiling; with two GPUs or more, each later GPU's best rung over the first's)
at N = 8192 or else the largest N every GPU has, then one of every rung and
peer at ladder.SHAPE (B=1 H=8 N=8192 D=128 fp16, non-causal), forward and
backward: each card's TFLOPS, its fraction of that card's GEMM ceiling, and
the ratio between the cards. The PNG draws the best rung's TFLOPS per GPU at
each D as grouped bars, non-causal and causal side by side.

Each GPU's forward rows are its folder's merged forward rows
(results_csv.load_gpu: fwd.csv and bench.csv, the newest row of each variant
and shape), picked for the shape table as in plot.py: Nq = Nk, D = Dv, its
most common (B, H), fp16 when present; its backward rows its bwd.csv's
(results_csv.load_bwd). A card's GEMM ceiling is cuBLAS's square 8192³ GEMM
as scripts/gemm_ceiling.py measured it in the gpu_check step that wrote the
rows (gemm_ceiling.txt beside bench.csv; gemm_ceiling_bwd.txt beside bwd.csv),
so each fraction is to its own card at the clocks of the same run; "–" where
the file is not there. Folders without a forward CSV are skipped. Exits 1 when
no GPU has results, 2 on an unreadable CSV.
"""
import argparse
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generated  # noqa: E402
import ladder  # noqa: E402
import results_csv as rc  # noqa: E402

DPI = 110
# A gpu_check step's GEMM ceiling file, per direction (scripts/gemm_ceiling.py's output), and its square GEMM's line.
CEILING_FILES = {"forward": "gemm_ceiling.txt", "backward": "gemm_ceiling_bwd.txt"}
SQUARE_GEMM = re.compile(r"^square GEMM \d+\^3: [\d.]+ ms, ([\d.]+) TFLOPS", re.MULTILINE)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results", help="folder with one sub-folder per GPU (default: results)")
    p.add_argument("--out", default="results", help="folder for compare_gpus.md/.png (default: results)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        rc.load_gone_commits(args.results)
        gpus = load_gpus(args.results)
    except rc.CsvError as e:
        print(f"compare_gpus.py: error: {e}", file=sys.stderr)
        return 2
    if not gpus:
        print(f"compare_gpus.py: error: no <gpu>/ folder with forward results under {args.results}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    for name, data in render(gpus, args.out).items():
        path = os.path.join(args.out, name)
        generated.write_if_changed(path, data)
        print(f"wrote {path}")
    return 0


def render(gpus, out_dir):
    """{file name: bytes}: compare_gpus.md and, when a rung ran on some GPU, compare_gpus.png."""
    pick_n(gpus)
    files = {"compare_gpus.md": markdown(gpus, out_dir).encode("utf-8")}
    fig = bar_chart(gpus)
    if fig is None:
        print("skipped compare_gpus.png: no rung ran on any GPU")
    else:
        files["compare_gpus.png"] = generated.png_bytes(fig, DPI)
    return files


def gemm_ceiling(folder, direction):
    """The TFLOPS of the square GEMM in `folder`'s GEMM ceiling file of `direction`, or None without one."""
    try:
        with open(os.path.join(folder, CEILING_FILES[direction]), encoding="utf-8") as f:
            m = SQUARE_GEMM.search(f.read())
    except OSError:
        return None
    return float(m.group(1)) if m else None


def load_gpus(results_dir):
    """{folder name: {'csvs': paths, 'slice': Slice, 'rows': merged forward rows, 'bwd': merged backward rows or
    None, 'ceiling': {direction: GEMM TFLOPS or None}}} for each GPU folder with forward results, sorted."""
    gpus = {}
    folders = sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []
    for name in folders:
        folder = os.path.join(results_dir, name)
        if not os.path.isdir(folder):
            continue
        csvs = rc.forward_csvs(folder)
        if not csvs:
            print(f"skipped {folder}: no {' or '.join(rc.FORWARD_CSVS)}")
            continue
        rows = rc.load(csvs)
        sl = rc.forward_slice(rows)
        if sl is None:
            print(f"skipped {folder}: no forward rows with Nq = Nk")
            continue
        gpus[name] = {"csvs": csvs, "slice": sl, "rows": rows, "bwd": rc.load_bwd(folder),
                      "ceiling": {d: gemm_ceiling(folder, d) for d in CEILING_FILES}}
    return gpus


def pick_n(gpus):
    """Sets each GPU's 'n': 8192, else the largest N all GPUs have, else the GPU's own pick."""
    common = set.intersection(*(set(g["slice"].values("Nq")) for g in gpus.values()))
    for g in gpus.values():
        g["n"] = rc.preferred_n(common or g["slice"].values("Nq"))


def shape_rows(g, d, causal):
    return g["slice"].at(Nq=g["n"], D=d, causal=causal)


def best_tflops(rows, kind):
    row = rc.best(rows, kind)
    return None if row is None else row["tflops"]


def fraction(tflops, ceiling):
    return None if tflops is None or not ceiling else tflops / ceiling


def over_first(values):
    """[each later value / the first], None where either is missing."""
    first = values[0]
    return [None if v is None or not first else v / first for v in values[1:]]


def markdown(gpus, out_dir):
    names = list(gpus)
    cross = [f"{n} / {names[0]}" for n in names[1:]]  # the later GPUs over the first, by folder name
    across = f"; {', '.join(cross)}: TFLOPS on one card over the other's" if cross else ""
    lines = ["# TFLOPS across GPUs", "",
             "Generated by `scripts/compare_gpus.py`. Best rung: the fastest of our kernels; best peer: the "
             "fastest of `unfused`, `torch(...)`, `sdpa(...)` and `fa4` (FlashAttention-4, "
             "`scripts/bench_peers.py`) that ran; ratio = best rung / best peer; / GEMM: the fraction of the card's "
             "GEMM ceiling, cuBLAS's square 8192³ GEMM measured in the same gpu_check step (`gemm_ceiling.txt`; "
             f"backward rows `gemm_ceiling_bwd.txt`){across}; – where none ran. Each GPU's rows: its folder's CSVs "
             "merged, the newest row of each variant and shape.", "",
             "| GPU | name | source | B | H | dtype | commit | date | GEMM ceiling (TFLOPS): forward, backward |",
             "|---|---|---|---:|---:|---|---|---|---|"]
    for name, g in gpus.items():
        sl = g["slice"]
        gpu, commits, dates = rc.provenance(sl.rows)
        sources = ", ".join(f"[{p}]({p})" for p in (rc.posix_relpath(c, out_dir) for c in g["csvs"]))
        ceilings = ", ".join(rc.fmt_tflops(g["ceiling"][d]) for d in CEILING_FILES)
        lines.append(f"| {name} | {gpu} | {sources} | {sl.B} | {sl.H} | {sl.dtype} | {commits} | {dates} | "
                     f"{ceilings} |")
    header = ["N", "D", "causal"] + [f"{n} {col}" for n in names for col in ("rung", "peer", "ratio", "rung / GEMM")]
    align = ["---:", "---:", ":---:"] + ["---:"] * (4 * len(names) + len(cross))
    lines += ["", "| " + " | ".join(header + [f"{c} rung" for c in cross]) + " |", "|" + "|".join(align) + "|"]
    for n, d, causal in table_keys(gpus):
        cells, rungs = [str(n), str(d), "yes" if causal else "no"], []
        for g in gpus.values():
            rows = shape_rows(g, d, causal) if g["n"] == n else []
            rung = best_tflops(rows, rc.RUNG)
            rungs.append(rung)
            cells += [rc.fmt_tflops(rung), rc.fmt_tflops(best_tflops(rows, rc.PEER)),
                      rc.fmt_ratio(rc.best_ratio(rows)), rc.fmt_ratio(fraction(rung, g["ceiling"]["forward"]))]
        lines.append("| " + " | ".join(cells + [rc.fmt_ratio(r) for r in over_first(rungs)]) + " |")
    lines += variant_table(gpus, cross)
    return "\n".join(lines) + "\n\n![best rung TFLOPS per GPU](compare_gpus.png)\n"


def variant_rows(rows, backward):
    """[(label, TFLOPS or None)] at ladder.SHAPE of `rows` (one GPU, one direction; None: no rows): each rung's
    best stage (ladder.best_stage), then each peer that ran."""
    if rows is None:
        return []
    at, table = ladder.ladder_rows(rows, ladder.BACKWARD_RUNGS if backward else ladder.FORWARD_RUNGS)
    found = [(f"{rung.number} `{rung.prefix}`", row["tflops"] if row else None) for rung, row, _ in table]
    return found + [(f"`{p}`", rc.tflops(at, p)) for p in rc.variants([r for r in at if rc.ran(r)], rc.PEER)]


def variant_table(gpus, cross):
    """The lines of the table of every rung and peer at ladder.SHAPE, forward then backward; [] where no GPU has
    a timed row there."""
    names = list(gpus)
    s = ladder.SHAPE
    lines = ["", f"## Every rung and peer at B={s['B']} H={s['H']} N={s['Nq']} D={s['D']}, {s['dtype']}, non-causal",
             "", "Forward rows from each card's forward CSVs, backward rows (`bwd`) from its `bwd.csv`; a rung's "
             "TFLOPS are its best stage's (or variant's); / GEMM: over the card's GEMM ceiling of the same "
             "direction; rows no card timed at this shape are left out.", "",
             "| row | " + " | ".join(f"{n} TFLOPS | {n} / GEMM" for n in names) +
             "".join(f" | {c}" for c in cross) + " |",
             "|---|" + "---:|" * (2 * len(names) + len(cross))]
    timed = 0
    for direction, backward in (("forward", False), ("backward", True)):
        per_gpu = [dict(variant_rows(g["bwd"] if backward else g["rows"], backward)) for g in gpus.values()]
        labels = list(dict.fromkeys(label for found in per_gpu for label in found))
        for label in labels:
            values = [found.get(label) for found in per_gpu]
            if all(v is None for v in values):
                continue
            timed += 1
            cells = [label]
            for v, g in zip(values, gpus.values()):
                cells += [rc.fmt_tflops(v), rc.fmt_ratio(fraction(v, g["ceiling"][direction]))]
            lines.append("| " + " | ".join(cells + [rc.fmt_ratio(r) for r in over_first(values)]) + " |")
    return lines if timed else []


def table_keys(gpus):
    """Sorted (N, D, causal) that some GPU has at its chosen N."""
    return sorted({(g["n"], r["D"], r["causal"]) for g in gpus.values() for r in g["slice"].at(Nq=g["n"])})


def bar_chart(gpus):
    """Grouped bars of the best rung's TFLOPS: one group per D, one bar per GPU, one panel per causal."""
    keys = table_keys(gpus)
    ds = sorted({d for _, d, _ in keys})
    causals = sorted({c for _, _, c in keys})
    heights = {(name, c): [best_tflops(shape_rows(g, d, c), rc.RUNG) for d in ds]
               for name, g in gpus.items() for c in causals}
    if all(h is None for hs in heights.values() for h in hs):
        return None
    width = 0.8 / len(gpus)
    fig, axes = plt.subplots(1, len(causals), figsize=(max(4.5, 1.4 * len(ds) * len(gpus) ** 0.5) * len(causals), 3.8),
                             sharey=True, squeeze=False, layout="constrained")
    for ax, causal in zip(axes[0], causals):
        for i, name in enumerate(gpus):
            xs = np.arange(len(ds)) + (i - (len(gpus) - 1) / 2) * width
            hs = heights[(name, causal)]
            bars = ax.bar(xs, [h or 0 for h in hs], width, label=name, color=f"C{i % 10}")
            ax.bar_label(bars, labels=["–" if h is None else f"{h:.0f}" for h in hs], fontsize=7, padding=2)
        ax.set_xticks(range(len(ds)), [str(d) for d in ds])
        ax.set_xlabel("D")
        ax.set_title("causal" if causal else "non-causal", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("best rung TFLOPS")
    axes[0][0].margins(y=0.12)  # room for the value labels; bars keep the axis at 0
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right center", fontsize=9)
    fig.suptitle(f"Best rung forward TFLOPS per GPU at {n_title(gpus)}")
    return fig


def n_title(gpus):
    ns = sorted({g["n"] for g in gpus.values()})
    if len(ns) == 1:
        return f"N={ns[0]}"
    return "each GPU's largest N (" + ", ".join(f"{name}: {g['n']}" for name, g in gpus.items()) + ")"


if __name__ == "__main__":
    sys.exit(main())
