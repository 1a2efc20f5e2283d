#!/usr/bin/env python3
"""Draw the docs' layout figures from the kernels' own sources.

    python3 scripts/figures.py [--root DIR] [--out DIR]

Writes, into DIR/docs/figures/ (or --out), four PNGs whose content is read
from the code, so a figure cannot drift from what the kernels do:

  mma_fragments.png   which lane holds which elements of the mma.m16n8k16 A
                      (16 x 16) and C (16 x 8) fragments: parsed from the
                      layout comment at the top of kernels/common/ptx.cuh (the
                      PTX ISA's "Matrix Fragments for mma.m16n8k16")
  warp_partitions.png rung 01's and rung 02's warps over a tile at D = 64: the
                      warp grids of SplitKvConfig (01_split_kv.cu) and the
                      rows of SplitQTiles<64> (02_split_q.cu)
  sw128_swizzle.png   the 128-byte swizzle atom: 8 rows x 8 chunks of 16 bytes,
                      placed by evaluating Sw128Blocks::offset of
                      kernels/common/wgmma.cuh
  kv_ring.png         a K/V ring of kWsStages slots (hopper/fwd_tile.h) over
                      time: a producer, two consumer warpgroups, each slot's
                      full and empty mbarrier and their phases, with the parity
                      each wait names (the rule of hopper/fwd_mainloop.cuh)

Each PNG records the matplotlib version that drew it and no time
(generated.png_bytes): the same sources and matplotlib give the same bytes.
scripts/regenerate.py draws them with everything else. Raises ValueError when
a source no longer says what is parsed from it.
"""
import argparse
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.patches import Rectangle  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generated  # noqa: E402

DPI = 100
FOLDER = ("docs", "figures")
FRAGMENTS, PARTITIONS, SWIZZLE, RING = "mma_fragments.png", "warp_partitions.png", "sw128_swizzle.png", "kv_ring.png"
NAMES = (FRAGMENTS, PARTITIONS, SWIZZLE, RING)
PTX = ("kernels", "common", "ptx.cuh")
WGMMA = ("kernels", "common", "wgmma.cuh")
RUNG01 = ("kernels", "flash_attn", "01_split_kv.cu")
RUNG02 = ("kernels", "flash_attn", "02_split_q.cu")
FWD_TILE = ("kernels", "hopper", "fwd_tile.h")
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def read(root, parts):
    with open(os.path.join(root, *parts), encoding="utf-8") as f:
        return f.read()


def found(root):
    """Whether `root` holds the sources the figures are drawn from."""
    return all(os.path.isfile(os.path.join(root, *p)) for p in (PTX, WGMMA, RUNG01, RUNG02, FWD_TILE))


def need(pattern, text, where, flags=0):
    m = re.search(pattern, text, flags)
    if m is None:
        raise ValueError(f"{'/'.join(where)} no longer has what figures.py reads: /{pattern}/")
    return m


# ---- the m16n8k16 fragments ----------------------------------------------------------

ENTRY = re.compile(r"(?P<regs>[ac]\d(?:,[ac]\d)?) = (?P<mat>[AC])\[(?P<row>g(?:\+8)?)\]\[(?P<col>2t(?:\+8)?)\.\.")


def fragment_layout(ptx_text):
    """{'A': {(row, col): (lane, register)}, 'C': ...} from ptx.cuh's layout comment (g = lane / 4, t = lane % 4)."""
    head = ptx_text.split("#pragma once")[0]
    layout = {"A": {}, "C": {}}
    for m in ENTRY.finditer(head):
        regs = m.group("regs").split(",")
        row_off = 8 if m.group("row").endswith("+8") else 0
        col_off = 8 if m.group("col").endswith("+8") else 0
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for k in range(2):  # two consecutive columns: one 16-bit pair, or c0 and c1
                reg = regs[k] if len(regs) == 2 else f"{regs[0]}.{'xy'[k]}"
                layout[m.group("mat")][(g + row_off, 2 * t + col_off + k)] = (lane, reg)
    if len(layout["A"]) != 256 or len(layout["C"]) != 128:
        raise ValueError("kernels/common/ptx.cuh: the A/C layout comment no longer covers 16x16 and 16x8 elements")
    return layout


def draw_fragments(layout):
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 6.6), gridspec_kw={"width_ratios": [16, 8]})
    for ax, name, cols, title in ((axes[0], "A", 16, "A fragment, 16 × 16 (rows × k), registers a0–a3"),
                                  (axes[1], "C", 8, "C fragment, 16 × 8 fp32 (rows × n), c0–c3")):
        for (r, c), (lane, reg) in layout[name].items():
            color = COLORS[int(reg[1])]
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=color, alpha=0.4, edgecolor="white", linewidth=1))
            ax.text(c + 0.5, r + 0.36, f"T{lane}", ha="center", va="center", fontsize=7.5)
            ax.text(c + 0.5, r + 0.74, reg, ha="center", va="center", fontsize=6, color="0.25")
        ax.set_xlim(0, cols)
        ax.set_ylim(16, 0)
        ax.set_xticks([i + 0.5 for i in range(cols)], [str(i) for i in range(cols)], fontsize=7)
        ax.set_yticks([i + 0.5 for i in range(16)], [str(i) for i in range(16)], fontsize=7)
        ax.axhline(8, color="black", linewidth=1.2)
        if cols == 16:
            ax.axvline(8, color="black", linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_aspect("equal")
        ax.tick_params(length=0)
        for s in ax.spines.values():
            s.set_visible(False)
    fig.suptitle("mma.sync.m16n8k16: lane T holds row g = T / 4 (and g + 8), columns 2·(T % 4) and +1 (and +8); "
                 "a quad of 4 lanes holds a whole row", fontsize=10)
    fig.text(0.5, 0.02, "From kernels/common/ptx.cuh (PTX ISA, \"Matrix Fragments for mma.m16n8k16\"). "
             "A wgmma accumulator gives each warp of the warpgroup this C layout for its 16 rows, "
             "repeated over N/8 column tiles.", ha="center", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    return generated.png_bytes(fig, DPI)


# ---- rung 01's and rung 02's warps ------------------------------------------------------

def partitions(rung01_text, rung02_text):
    """{'01': {...}, '02': {...}} of the tile sizes and warp grids at D = 64, from the rungs' config structs."""
    def num(name, text, where):
        return int(need(rf"\b{name} = (\d+)", text, where).group(1))
    p01 = {k: num(k, rung01_text, RUNG01) for k in ("kBr", "kBc", "kWarps", "kWarpRowsS", "kWarpKeysS",
                                                      "kWarpRowsO", "kWarpColsO")}
    m = need(r"struct SplitQTiles<64>\s*\{[^}]*kBr = (\d+), kBc = (\d+), kWarps = (\d+), kMTiles = (\d+);",
             rung02_text, RUNG02)
    p02 = dict(zip(("kBr", "kBc", "kWarps", "kMTiles"), map(int, m.groups())))
    if p01["kWarpRowsS"] * p01["kWarpKeysS"] != p01["kWarps"] or p02["kBr"] != p02["kWarps"] * 16 * p02["kMTiles"]:
        raise ValueError("figures.py: the rungs' warp grids no longer cover their tiles")
    return {"01": p01, "02": p02}


def draw_grid(ax, rows, cols, grid_rows, grid_cols, title, xlabel, order="row"):
    """A rows x cols tile split into grid_rows x grid_cols warp blocks, each labelled with its warp."""
    h, w = rows / grid_rows, cols / grid_cols
    for i in range(grid_rows):
        for j in range(grid_cols):
            warp = i * grid_cols + j if order == "row" else j * grid_rows + i
            ax.add_patch(Rectangle((j * w, i * h), w, h, facecolor=COLORS[warp % len(COLORS)], alpha=0.45,
                                   edgecolor="black", linewidth=1))
            ax.text(j * w + w / 2, i * h + h / 2, f"warp {warp}", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_title(title, fontsize=9.5)
    ax.set_xlabel(xlabel, fontsize=8.5)
    ax.set_ylabel("query rows", fontsize=8.5)
    ax.tick_params(labelsize=7)


def draw_partitions(p):
    a, b = p["01"], p["02"]
    D = 64
    fig, axes = plt.subplots(2, 2, figsize=(11, 9.2))
    draw_grid(axes[0][0], a["kBr"], a["kBc"], a["kWarpRowsS"], a["kWarpKeysS"],
              f"rung 01, S = Q·K_jᵀ [{a['kBr']} × {a['kBc']}]:\n{a['kWarpRowsS']} × {a['kWarpKeysS']} warps "
              f"of [{a['kBr'] // a['kWarpRowsS']} rows, {a['kBc'] // a['kWarpKeysS']} keys]; a row's max and sum\n"
              "need 4 warps: S → sS, softmax pass, P → sP", "keys of tile j")
    # P·V: warp w takes rows 16·(w % 4) and columns (w / 4)·D/2 (o_row0, o_col0 in split_kv_kernel).
    draw_grid(axes[0][1], a["kBr"], D, a["kWarpRowsO"], a["kWarpColsO"],
              f"rung 01, O += P·V_j [{a['kBr']} × D]:\n{a['kWarpRowsO']} × {a['kWarpColsO']} warps "
              f"of [{a['kBr'] // a['kWarpRowsO']} rows, D/{a['kWarpColsO']}], P read back from sP",
              "head dim", order="col")
    draw_grid(axes[1][0], b["kBr"], b["kBc"], b["kWarps"], 1,
              f"rung 02, S = Q·K_jᵀ [{b['kBr']} × {b['kBc']}]:\n{b['kWarps']} warps of "
              f"{16 * b['kMTiles']} whole rows; softmax in registers", "keys of tile j")
    draw_grid(axes[1][1], b["kBr"], D, b["kWarps"], 1,
              f"rung 02, O += P·V_j [{b['kBr']} × D]:\nthe same rows, P from the warp's own registers",
              "head dim")
    fig.suptitle(f"Who computes what at D = {D}: rung 01 splits the keys (FlashAttention-1's split), "
                 "rung 02 the query rows (FlashAttention-2's)", fontsize=10.5)
    fig.text(0.5, 0.012, "Rung 01: two partitions per tile, S and P through shared memory between them "
             "(four barriers per tile). Rung 02: one partition (three barriers).\nTiles and warp grids from "
             "SplitKvConfig (01_split_kv.cu) and SplitQTiles<64> (02_split_q.cu).", ha="center", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.04, 1, 0.96), h_pad=2, w_pad=3)
    return generated.png_bytes(fig, DPI)


# ---- the 128-byte swizzle ------------------------------------------------------------------

def sw128_offset_function(wgmma_text, rows=8):
    """Sw128Blocks<rows>::offset(row, col) of wgmma.cuh (in 16-bit elements), evaluated as written in C++."""
    body = need(r"struct Sw128Blocks \{.*?offset\(int row, int col\) \{\s*return (?P<expr>[^;]+);", wgmma_text,
                WGMMA, re.S).group("expr")
    code = compile(body, "Sw128Blocks::offset", "eval")
    return lambda row, col: eval(code, {"__builtins__": {}}, {"row": row, "col": col, "kBlockElems": rows * 64})


def draw_swizzle(offset):
    # Logical chunk c of row r (columns 8c .. 8c+7) is stored at element offset(r, 8c); its stored chunk is
    # (offset - 64 r) / 8.
    stored = {(r, c): (offset(r, 8 * c) - 64 * r) // 8 for r in range(8) for c in range(8)}
    if sorted(stored[(r, c)] for r in range(8) for c in range(8)) != sorted(list(range(8)) * 8):
        raise ValueError("Sw128Blocks::offset no longer permutes the 8 chunks of a row")
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 5.6))
    for ax, title, cell in ((axes[0], "logical: row r, chunk c (16 bytes = 8 halves)", lambda r, p: p),
                            (axes[1], "stored: chunk c of row r at chunk c ^ (r % 8)",
                             lambda r, p: next(c for c in range(8) if stored[(r, c)] == p))):
        for r in range(8):
            for p in range(8):
                c = cell(r, p)
                ax.add_patch(Rectangle((p, r), 1, 1, facecolor=COLORS[c], alpha=0.55, edgecolor="white",
                                       linewidth=1.5))
                ax.text(p + 0.5, r + 0.5, f"c{c}", ha="center", va="center", fontsize=9)
        ax.set_xlim(0, 8)
        ax.set_ylim(8, 0)
        ax.set_xticks([p + 0.5 for p in range(8)], [f"{16 * p}" for p in range(8)], fontsize=7.5)
        ax.set_yticks([r + 0.5 for r in range(8)], [f"r{r}  +{128 * r}" for r in range(8)], fontsize=7.5)
        ax.set_xlabel("byte offset in the 128-byte row (banks 4·chunk .. 4·chunk + 3)", fontsize=8.5)
        ax.set_title(title, fontsize=10)
        ax.set_aspect("equal")
        ax.tick_params(length=0)
    for r in range(8):  # chunk 0 of every row: where an 8-row ldmatrix or a k-step's column reads
        axes[1].add_patch(Rectangle((stored[(r, 0)], r), 1, 1, fill=False, edgecolor="black", linewidth=2))
    fig.suptitle("The 128-byte swizzle atom (wgmma's SWIZZLE_128B, Sw128Blocks): 8 rows × 128 bytes = 1024 bytes, "
                 "1024-byte aligned", fontsize=10.5)
    fig.text(0.5, 0.015, "Outlined: chunk 0 of rows 0–7, which one ldmatrix phase (or one column of a k-step) "
             "reads: 8 different 16-byte bank groups, no conflict.\nPlacement evaluated from Sw128Blocks::offset "
             "in kernels/common/wgmma.cuh; in an address, bits 4–6 (the chunk) are XORed with bits 7–9 (the row).",
             ha="center", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.07, 1, 0.94))
    return generated.png_bytes(fig, DPI)


# ---- the K/V ring over time -----------------------------------------------------------------

def ring_stages(fwd_tile_text):
    return int(need(r"constexpr int kWsStages = (\d+);", fwd_tile_text, FWD_TILE).group(1))


def ring_schedule(stages, tiles=6, load=1.2, compute=(2.6, 3.1), lag=(0.0, 0.6)):
    """An illustrative timeline of the ring: (producer loads, consumer tiles, full/empty completions).

    The rule is hopper/fwd_mainloop.cuh's: tile g goes to slot g % S; the producer waits for phase g/S - 1 of
    empty[slot] (both consumers released tile g - S) before loading; a consumer waits for phase g/S of
    full[slot] (the tile's bytes landed) and its own previous tile, computes, then arrives on empty[slot].
    Durations are made up (a load shorter than a tile's compute, warpgroup 1 a little behind).
    """
    loads, work, full_done, empty_done = [], {0: [], 1: []}, {}, {}
    t = 0.0
    for g in range(tiles):
        start = max(t, empty_done.get(g - stages, 0.0))
        loads.append((g, start, start + load))
        full_done[g] = start + load
        t = start + load
        # Consumers of tile g (they run as soon as the tile and their previous tile allow).
        ends = []
        for c in (0, 1):
            prev_end = work[c][-1][2] if work[c] else lag[c]
            begin = max(full_done[g], prev_end)
            work[c].append((g, begin, begin + compute[c]))
            ends.append(begin + compute[c])
        empty_done[g] = max(ends)
    return loads, work, full_done, empty_done


def draw_ring(stages):
    loads, work, full_done, empty_done = ring_schedule(stages)
    end = max(e for _, _, e in work[1]) + 1.0
    lanes = ["producer\n(one thread)", "consumer\nwarpgroup 0", "consumer\nwarpgroup 1"]
    bars = [f"{kind}[{s}]" for kind in ("full", "empty") for s in range(stages)]
    y = {name: i for i, name in enumerate(lanes + bars)}
    fig, ax = plt.subplots(figsize=(13.5, 6.6))
    for g, a, b in loads:
        s = g % stages
        ax.add_patch(Rectangle((a, y[lanes[0]] - 0.35), b - a, 0.7, facecolor=COLORS[s], alpha=0.6, edgecolor="black"))
        ax.text((a + b) / 2, y[lanes[0]], f"TMA\ntile {g}→s{s}", ha="center", va="center", fontsize=7)
        if g >= stages:
            ax.text(a, y[lanes[0]] - 0.45, f"wait empty[{s}]\nparity {(g // stages - 1) & 1}", ha="center",
                    va="bottom", fontsize=6.5, color="0.3")
    for c in (0, 1):
        prev = 0.0
        for g, a, b in work[c]:
            s = g % stages
            lane = y[lanes[1 + c]]
            if a > prev + 1e-9:
                ax.add_patch(Rectangle((prev, lane - 0.1), a - prev, 0.2, facecolor="0.85", edgecolor="none"))
            ax.add_patch(Rectangle((a, lane - 0.35), b - a, 0.7, facecolor=COLORS[s], alpha=0.35, edgecolor="black"))
            ax.text((a + b) / 2, lane, f"tile {g} (slot {s})\nafter full[{s}] parity {(g // stages) & 1}",
                    ha="center", va="center", fontsize=7)
            prev = b
    # Each barrier's phases: phase k of full[s] completes when tile s + k·S has landed, phase k of
    # empty[s] when both consumers have released it.
    for kind, done in (("full", full_done), ("empty", empty_done)):
        for s in range(stages):
            lane = y[f"{kind}[{s}]"]
            times = [done[g] for g in sorted(done) if g % stages == s]
            edges = [0.0] + times + [end]
            for k in range(len(edges) - 1):
                ax.add_patch(Rectangle((edges[k], lane - 0.22), edges[k + 1] - edges[k], 0.44,
                                       facecolor="white" if k % 2 == 0 else "0.88", edgecolor="0.5"))
                ax.text((edges[k] + edges[k + 1]) / 2, lane, f"phase {k}", ha="center", va="center", fontsize=7)
            for k, when in enumerate(times):
                ax.plot([when], [lane - 0.22], marker="v", color="black", markersize=6)
                ax.text(when, lane - 0.3, f"phase {k} done: parity {k & 1}", ha="center", va="bottom", fontsize=6.5)
    ax.set_yticks(range(len(y)), list(y), fontsize=8.5)
    ax.set_ylim(len(y) - 0.4, -0.9)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (illustrative units)", fontsize=9)
    ax.set_xticks([])
    ax.axhline(len(lanes) - 0.5, color="0.4", linewidth=0.8)
    ax.set_title(f"A K/V ring of {stages} slots (rung 12's kWsStages): tile g goes to slot g % {stages}; tile g "
                 f"waits for parity (g / {stages}) % 2 of full, its refill for parity (g / {stages} − 1) % 2 of "
                 "empty\nfull[s] completes a phase on 1 arrival (arrive_expect_tx) and the tile's bytes; empty[s] on "
                 "one arrival per consumer warp (both warpgroups)", fontsize=9.5)
    fig.text(0.5, 0.012, "A wait names only a parity, so no waiter may fall two phases behind: the producer "
             "cannot refill a slot (the next full phase) before both consumers released it (empty).\n"
             "Grey bar: a warpgroup waiting. Durations are illustrative; the waits and parities are "
             "hopper/fwd_mainloop.cuh's.", ha="center", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return generated.png_bytes(fig, DPI)


# ---- all of them ---------------------------------------------------------------------------

def render(root):
    """{file name: PNG bytes} of every figure, from the sources under `root`."""
    return {
        FRAGMENTS: draw_fragments(fragment_layout(read(root, PTX))),
        PARTITIONS: draw_partitions(partitions(read(root, RUNG01), read(root, RUNG02))),
        SWIZZLE: draw_swizzle(sw128_offset_function(read(root, WGMMA))),
        RING: draw_ring(ring_stages(read(root, FWD_TILE))),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", help="folder for the PNGs (default: ROOT/docs/figures)")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(args.root, *FOLDER)
    try:
        figures = render(args.root)
    except (OSError, ValueError) as e:
        print(f"figures.py: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    for name, data in figures.items():
        if generated.write_if_changed(os.path.join(out, name), data):
            print(f"wrote {os.path.join(out, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
