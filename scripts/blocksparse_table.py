"""The block-sparse results table of docs/blocksparse.md and its plot
(results/<gpu>/blocksparse.png), from results/<gpu>/blocksparse.csv.

    <!-- blocksparse:begin --> ... <!-- blocksparse:end -->

blocksparse.csv (scripts/bench_blocksparse.py) has the results columns
(results_csv.COLUMNS) and `mask`, `score`; its rows are merged by
results_csv's rule (the newest date of each variant, shape, mask and score).
One line per (shape, mask, score): our forward and backward TFLOPS
(attnlab.flex_attention's, or dmattn's on a dmattn_topk mask), compiled
flex_attention's measured in the same process, and their ratio; a row that
did not pass its check shows its status instead of a number. Where the CSV
has rows of flex_attention on FlashAttention-4's kernels (`flex_attention(flash)`,
kernel_options BACKEND FLASH), the table and plot show them beside
flex's Triton backend, and the ratio is to the faster flex that passed. The
plot shows the same lines as bars: ours and flex_attention, forward and
backward, our speed-up over flex above our bars.
"""
import csv
import os

import results_csv as rc

BEGIN, END = "<!-- blocksparse:begin -->", "<!-- blocksparse:end -->"
CSV = "blocksparse.csv"
PNG = "blocksparse.png"
DPI = 110
OURS, PEER, FLASH_PEER = "blocksparse", "flex_attention", "flex_attention(flash)"
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


def _faster(*peers):
    """The faster of `peers` that passed, else the first (its status is what the table shows)."""
    ok = [r for r in peers if _passed(r)]
    return max(ok, key=lambda r: r["tflops"]) if ok else peers[0]


def _peers(rows):
    """The flex backends the rows hold: flex_attention, and flex_attention(flash) where it has rows."""
    return (PEER, FLASH_PEER) if any(r["variant"].startswith(FLASH_PEER) for r in rows) else (PEER,)


def _by_case(rows):
    """The (shape, mask, score) cases in first-seen order, and each one's rows by variant."""
    cases, by = [], {}
    for r in rows:
        case = (r["B"], r["H"], r["Nq"], r["D"], r["Dv"], r["dtype"], r["mask"], r["score"])
        if case not in by:
            cases.append(case)
        by.setdefault(case, {})[r["variant"]] = r
    return cases, by


def _ours_names(mask, variants):
    """Our rows of a case: dmattn's masks show dmattn, then the engine where it ran them."""
    if mask.startswith(DMATTN):
        return [DMATTN] + ([OURS] if OURS in variants else [])
    return [OURS]


def _passed(row):
    return row is not None and row["status"] == "PASS" and row["tflops"]


def plot(rows):
    """blocksparse.png as bytes: TFLOPS of ours and flex_attention per case, forward and
    backward, our speed-up above our bars; None without rows."""
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import generated

    cases, by = _by_case(rows)
    shapes = {c[:6] for c in cases}
    peers = _peers(rows)
    labels, bars = [], []  # bars: per case, the rows of ours fwd, each flex fwd, ours bwd, each flex bwd
    for case in cases:
        B, H, N, D, Dv, dtype, mask, score = case
        v = by[case]
        for ours in _ours_names(mask, v):
            name = mask.replace(";", ",")
            label = (name.replace(":", ":\n", 1) if len(name) > 16 else name) + ("" if score == "none" else f"\n+ {score}")
            if ours == OURS and mask.startswith(DMATTN):
                label += "\n(engine)"
            if len(shapes) > 1:
                label += f"\nB{B} H{H} N{N} D{D}"
            labels.append(label)
            bars.append(tuple(v.get(name + suffix) for suffix in ("", " bwd") for name in (ours,) + peers))
    peer_colours = {PEER: "tab:gray", FLASH_PEER: "tab:olive"}
    series = [(f"{'ours' if name == OURS else name}, {direction}", peer_colours.get(name, "tab:blue"), hatch)
              for direction, hatch in (("forward", ""), ("backward", "//")) for name in (OURS,) + peers]
    group = 1 + len(peers)  # ours, then each flex, per direction
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(labels)), 4.5), layout="constrained")
    for i, (name, colour, hatch) in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(labels))]
        heights = [b[i]["tflops"] if _passed(b[i]) else 0.0 for b in bars]
        ax.bar(xs, heights, width, label=name, color=colour, hatch=hatch, edgecolor="white", linewidth=0.5)
        if i % group == 0:  # ours: the speed-up over the faster flex in the same direction
            for x, h, b in zip(xs, heights, bars):
                peer = _faster(*b[i + 1:i + group])
                if _passed(b[i]) and _passed(peer):
                    ax.text(x, h, f"{b[i]['tflops'] / peer['tflops']:.2f}×", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("TFLOPS (kept pairs)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=group)
    title = f"block-sparse attention against compiled flex_attention: {', '.join(sorted({r['gpu'] for r in rows}))}"
    if len(shapes) == 1:
        B, H, N, D, Dv, dtype = next(iter(shapes))
        title += f", B={B} H={H} N={N} D={D}{'' if D == Dv else f'/{Dv}'} {dtype}"
    ax.set_title(title, fontsize=10)
    return generated.png_bytes(fig, DPI)


def block(rows, csv_link):
    """The table's markdown (or a line saying there are no results yet)."""
    if not rows:
        return f"No block-sparse results yet (`scripts/gpu_check.sh blocksparse` writes `{csv_link}`)."
    cases, by = _by_case(rows)
    gpus = sorted({r["gpu"] for r in rows})
    peers = _peers(rows)
    flash = (" flex FLASH is the same compiled flex_attention on FlashAttention-4's kernels (kernel_options "
             "BACKEND FLASH), `unsupported` where torch refuses the mask or score there; × is ours over the faster "
             "flex that passed." if len(peers) > 1 else "")
    flex = " | ".join(("flex", "flex FLASH")[:len(peers)])
    lines = [f"TFLOPS on {', '.join(gpus)} from `{csv_link}` (forward 2·B·H·(D+Dv)·pairs, backward "
             "2·B·H·(3D+2Dv)·pairs, pairs the (query, key) pairs the mask keeps); flex_attention is torch's, "
             "compiled, on the same block mask, in the same process; ours is dmattn on the `dmattn_topk` masks, and "
             "the block-sparse engine on them where marked (engine: the mask a tensor mask_mod, the bias a tensor "
             f"score_mod).{flash}", "",
             f"| shape | mask_mod | score_mod | ours fwd | {flex.replace(' |', ' fwd |')} fwd | × | ours bwd | "
             f"{flex.replace(' |', ' bwd |')} bwd | × |",
             "|" + "---|" * (3 + 2 * (2 + len(peers)))]
    for case in cases:
        B, H, N, D, Dv, dtype, mask, score = case
        v = by[case]
        # dmattn's masks: dmattn, then the engine where it ran them (a tensor mask_mod and score_mod)
        names = _ours_names(mask, v)
        for ours in names:
            dims = f"D{D}" if D == Dv else f"D{D}/{Dv}"
            label = f"`{mask.replace(';', ',')}`" + (" (engine)" if ours == OURS and len(names) > 1 else "")
            cells = [f"B{B} H{H} N{N} {dims} {dtype}", label, score]
            for suffix in ("", " bwd"):
                mine, theirs = v.get(ours + suffix), [v.get(p + suffix) for p in peers]
                cells += [_figure(mine), *map(_figure, theirs), _ratio(mine, _faster(*theirs))]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
