"""The ladder's rungs, and the one-shape table of them the README and docs/ladder.md show.

RUNGS is the one list of rungs the scripts know: number, the prefix of its
variants' names (a rung's variants are PREFIX+stage..., e.g. split-q+stage2),
the rung it grows from, its family (the plots' colour, docs/results.md) and
its idea in one line. The table (ladder_block) has one row per rung at SHAPE:
the TFLOPS of the rung's best stage, its ratio to the best stage of the rung it
grows from, to sdpa(flash) (FlashAttention-2) and to sdpa(cudnn), all from the
merged rows of one GPU folder (results_csv.load_gpu); "–" with a short reason
where a rung has no timed row at that shape.

    python3 scripts/ladder.py results/H200      # prints the table
"""
import argparse
import os
import sys
from collections import namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_csv as rc  # noqa: E402

Rung = namedtuple("Rung", "number prefix parent family page idea")
MMA, HOPPER, SPLIT_D, TWO_PASS = "mma.sync", "Hopper dense", "split-D", "two-pass"

RUNGS = tuple(Rung(*r) for r in (
    # number, prefix, grows from, family, docs page, idea
    ("00", "minimal", None, MMA, "00_online_softmax.md",
     "one fused kernel in plain FP32 math: the online softmax, no tensor cores"),
    ("01", "split-kv", "00", MMA, "01_split_kv.md",
     "FlashAttention-1 on tensor cores: warps split the keys, S and P go through shared memory"),
    ("02", "split-q", "01", MMA, "02_split_q.md",
     "FlashAttention-2: warps split the query rows, P stays in registers"),
    ("03", "share-kv", "02", MMA, "03_share_kv.md",
     "K and V stream through one ring of shared-memory slots"),
    ("04", "share-qkv", "03", MMA, "04_share_qkv.md",
     "Q read into registers once; its shared memory joins the K/V ring"),
    ("05", "tiling-qk", "02", MMA, "05_tiling_qk.md",
     "Q·Kᵀ tiled along the head dim: head dims up to 1024"),
    ("06", "tiling-qkv", "05", MMA, "06_tiling_qkv.md",
     "P·V tiled along D too: shared memory independent of D"),
    ("07", "wgmma", "02", HOPPER, "07_wgmma.md",
     "Hopper `wgmma` from swizzled shared memory; softmax overlapped with P·V"),
    ("08", "wgmma-split-d", "07", SPLIT_D, "08_wgmma_split_d.md",
     "D = 512: two warpgroups split the head dim, partial S summed in shared memory"),
    ("09", "tma-split-d", "08", SPLIT_D, "09_tma_split_d.md",
     "rung 08 fed by TMA from a producer warpgroup"),
    ("10", "cluster-split-d", "09", SPLIT_D, "10_cluster_split_d.md",
     "D = 1024: a 2-block cluster splits the head dim, S summed in distributed shared memory"),
    ("11", "two-pass", "10", TWO_PASS, "11_two_pass.md",
     "large D: pass 1 writes P̃ = exp(S − m_ref), pass 2 is the GEMM P̃·V"),
    ("12", "ws", "07", HOPPER, "12_ws_pingpong.md",
     "rung 07 fed by TMA from a producer warp; warpgroups take turns on the tensor cores"),
))
BY_NUMBER = {r.number: r for r in RUNGS}
FAMILIES = (MMA, HOPPER, SPLIT_D, TWO_PASS)

# The one shape of the table: B=1 H=8 N=8192 D=128 fp16, non-causal.
SHAPE = dict(B=1, H=8, Nq=8192, Nk=8192, D=128, Dv=128, dtype="fp16", causal=0)
FA2, CUDNN = "sdpa(flash)", "sdpa(cudnn)"
BEGIN, END = "<!-- ladder:begin -->", "<!-- ladder:end -->"


def is_variant_of(variant, prefix):
    return variant == prefix or variant.startswith(prefix + "+")


def rung_of(variant):
    """The Rung whose variant `variant` is, or None (a peer, or a name no rung has)."""
    return next((r for r in RUNGS if is_variant_of(variant, r.prefix)), None)


def stage_of(variant, rung):
    """'split-q+swizzle+stage2' -> 'swizzle+stage2'; '' for a variant named like its rung."""
    return variant[len(rung.prefix) + 1:]


def best_stage(rows, rung):
    """The fastest row of `rung` that ran among `rows` (one shape), or None."""
    mine = [r for r in rows if r["kind"] == rc.RUNG and is_variant_of(r["variant"], rung.prefix) and rc.ran(r)]
    return max(mine, key=lambda r: (r["tflops"], r["variant"]), default=None)


def why_not(rows_at, all_rows, rung):
    """A short reason why `rung` has no timed row at the shape of `rows_at`."""
    mine = sorted((r for r in rows_at if is_variant_of(r["variant"], rung.prefix)), key=lambda r: r["variant"])
    if mine:
        notes = sorted({r["note"] for r in mine if r["status"] == "unsupported" and r["note"]})
        if notes:
            return notes[0].replace("|", "/")
        return ", ".join(sorted({r["status"] for r in mine}))
    if any(is_variant_of(r["variant"], rung.prefix) for r in all_rows):
        return "not run at this shape"
    return "no rows in the results"


def ladder_rows(rows):
    """(the rows at SHAPE, [(rung, its best row or None, why not or None)] for every rung)."""
    at = [r for r in rows if all(r[k] == v for k, v in SHAPE.items())]
    table = []
    for rung in RUNGS:
        row = best_stage(at, rung)
        table.append((rung, row, None if row else why_not(at, rows, rung)))
    return at, table


def ratio(a, b):
    return "–" if a is None or b is None else f"{a / b:.2f}"


def ladder_block(rows, gpu_folder, docs_dir, pages=()):
    """The markdown between the ladder markers.

    `gpu_folder` names the rows' source in the caption (e.g. results/H200);
    `docs_dir` is the docs folder relative to the page, with its trailing '/'
    ('' beside it), and `pages` the file names there: a rung whose page exists
    links to it.
    """
    at, table = ladder_rows(rows)
    best = {rung.number: row for rung, row, _ in table}
    fa2, cudnn = rc.tflops(at, FA2), rc.tflops(at, CUDNN)
    used = [row for _, row, _ in table if row] + [r for r in at if r["variant"] in (FA2, CUDNN) and rc.ran(r)]
    gpus, commits, span = rc.provenance(used)
    s = SHAPE
    lines = [f"<!-- generated by scripts/regenerate.py from {gpu_folder}; edit the CSVs, not this block -->",
             f"Forward, B={s['B']} H={s['H']} N={s['Nq']} D={s['D']}, {s['dtype']}, non-causal, on {gpus} "
             f"(commit {commits}, {span}). TFLOPS of each rung's best stage; × previous: over the best stage of "
             f"the rung it grows from (in brackets); × FA2, × cuDNN: over `{FA2}` and `{CUDNN}` at the same shape.",
             "", "| rung | idea | TFLOPS | × previous | × FA2 | × cuDNN |", "|---|---|---:|---:|---:|---:|"]
    for rung, row, reason in table:
        name = f"{rung.number} `{rung.prefix}`"
        if rung.page in pages:
            name = f"[{name}]({docs_dir}{rung.page})"
        if row is None:
            cells = [f"– ({reason})", "–", "–", "–"]
        else:
            stage = stage_of(row["variant"], rung)
            parent = best.get(rung.parent) if rung.parent else None
            prev = "–" if rung.parent is None else f"{ratio(row['tflops'], parent and parent['tflops'])} ({rung.parent})"
            cells = [f"{row['tflops']:.1f}" + (f" ({stage})" if stage else ""), prev,
                     ratio(row["tflops"], fa2), ratio(row["tflops"], cudnn)]
        lines.append("| " + " | ".join([name, rung.idea] + cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpu_folder", help="results/<gpu>")
    args = ap.parse_args(argv)
    try:
        rows = rc.load_gpu(args.gpu_folder)
    except rc.CsvError as e:
        print(f"ladder.py: error: {e}", file=sys.stderr)
        return 2
    print(ladder_block(rows, args.gpu_folder, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
