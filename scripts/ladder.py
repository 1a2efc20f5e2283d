"""The ladder's rungs, and the one-shape tables of them the README and docs/ladder.md show.

RUNGS is the one list of rungs the scripts know: number, the prefix of its
variants' names (a rung's variants are PREFIX+stage..., e.g. split-q+stage2),
the rung it grows from, its family (the plots' colour, docs/results.md) and
its idea in one line. The main path (MAIN_PATH: 00, 01, 02, 07, 12) is the
chain of rungs that the engine, rung ENGINE, grows from; every other forward
rung is a side branch. The forward rungs' families are FAMILIES; the backward
rungs (family BACKWARD, variants bwd-...) have their own CSV (bwd.csv) and
table. A table (ladder_block) has one row per rung of its direction at SHAPE:
the TFLOPS of the rung's best stage, its ratio to the best stage of the rung it
grows from, to FlashAttention-2 and to cuDNN (sdpa(flash) and sdpa(cudnn); in
the backward table their backward, "sdpa(flash) bwd" and "sdpa(cudnn) bwd"),
all from the merged rows of one GPU folder (results_csv.load_gpu, resp.
load_bwd); "–" with a short reason where a rung has no timed row at that shape.

    python3 scripts/ladder.py results/H200 [--bwd]     # prints the table
"""
import argparse
import csv
import os
import sys
from collections import namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_csv as rc  # noqa: E402

Rung = namedtuple("Rung", "number prefix parent family page idea")
MMA, HOPPER, SPLIT_D, TWO_PASS = "mma.sync", "Hopper dense", "split-D", "two-pass"
BACKWARD = "backward"

RUNGS = tuple(Rung(*r) for r in (
    # number, prefix, grows from, family, docs page, idea
    ("00", "minimal", None, MMA, "00_online_softmax.md",
     "one fused kernel in plain FP32 math: the online softmax, no tensor cores"),
    ("01", "split-kv", "00", MMA, "01_split_kv.md",
     "FlashAttention-2's loop with FlashAttention-1's split of the keys between warps: S and P go through shared memory"),
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
     "rung 07 fed by TMA from a producer warpgroup; warpgroups take turns on the tensor cores"),
    ("13", "bwd-mma", "02", BACKWARD, "13_bwd_mma.md",
     "FlashAttention-2's backward in mma.sync: a block per key tile, dQ by fp32 atomics"),
    ("14", "bwd-ws", "13", BACKWARD, "14_bwd_ws.md",
     "FlashAttention-3's backward: TMA producer, two wgmma warpgroups on Sᵀ, dQ by bulk reduce-add from a writer warp"),
    ("15", "bwd-roles", "14", BACKWARD, "15_bwd_ws_roles.md",
     "D = 256: both warpgroups on one 64-key tile, one the P chain and one the dS chain; dQ staged in the ring slot"),
))
BY_NUMBER = {r.number: r for r in RUNGS}
FAMILIES = (MMA, HOPPER, SPLIT_D, TWO_PASS)  # the forward rungs' families: the forward plots' colours
FORWARD_RUNGS = tuple(r for r in RUNGS if r.family != BACKWARD)
BACKWARD_RUNGS = tuple(r for r in RUNGS if r.family == BACKWARD)
ENGINE = "12"  # the forward engine: the main path's last rung
# A rung's steps (variants run on request, one idea each), in the order its page
# teaches them, before its other stages: rung 12's towards the engine.
STEPS = {"ws": ("ws+tma", "ws+tma+pingpong", "ws+tma+pingpong+persistent")}


def stage_order(prefix, variant):
    """Sort key of rung `prefix`'s variant: its steps first, in STEPS's order, then the others by name."""
    steps = STEPS.get(prefix, ())
    return (0, steps.index(variant), "") if variant in steps else (1, 0, variant)


def lineage(number):
    """The rungs from the first to `number`, each the one the next grows from: ('00', '01', '02', '07', '12')."""
    chain = []
    while number is not None:
        chain.append(number)
        number = BY_NUMBER[number].parent
    return tuple(reversed(chain))


MAIN_PATH = lineage(ENGINE)  # the forward rungs a learner climbs; the others are side branches

# The one shape of the table: B=1 H=8 N=8192 D=128 fp16, non-causal.
SHAPE = dict(B=1, H=8, Nq=8192, Nk=8192, D=128, Dv=128, dtype="fp16", causal=0)
FA2, CUDNN = "sdpa(flash)", "sdpa(cudnn)"
BWD = " bwd"  # a peer's backward row: its name and this ("sdpa(cudnn) bwd")
BEGIN, END = "<!-- ladder:begin -->", "<!-- ladder:end -->"
BWD_BEGIN, BWD_END = "<!-- ladder-bwd:begin -->", "<!-- ladder-bwd:end -->"


def is_variant_of(variant, prefix):
    return variant == prefix or variant.startswith(prefix + "+")


def rung_of(variant):
    """The Rung whose variant `variant` is, or None (a peer, or a name no rung has)."""
    return next((r for r in RUNGS if is_variant_of(variant, r.prefix)), None)


def on_main_path(variant):
    """Whether `variant` is a variant of a main-path rung (a peer, a side branch or an unknown name: False)."""
    rung = rung_of(variant)
    return rung is not None and rung.number in MAIN_PATH


def is_backward(prefix):
    """Whether `prefix` names a backward rung (its rows are in bwd.csv)."""
    return any(r.prefix == prefix and r.family == BACKWARD for r in RUNGS)


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
            return rc.note_text(notes[0]).replace("|", "/")
        return ", ".join(sorted({r["status"] for r in mine}))
    if any(is_variant_of(r["variant"], rung.prefix) for r in all_rows):
        return "not run at this shape"
    return "no rows in the results"


def ladder_rows(rows, rungs=FORWARD_RUNGS):
    """(the rows at SHAPE, [(rung, its best row or None, why not or None)] for every rung of `rungs`)."""
    at = [r for r in rows if all(r[k] == v for k, v in SHAPE.items())]
    table = []
    for rung in rungs:
        row = best_stage(at, rung)
        table.append((rung, row, None if row else why_not(at, rows, rung)))
    return at, table


def ratio(a, b):
    return "–" if a is None or b is None else f"{a / b:.2f}"


PROFILES_CSV = "ncu_steps.csv"  # scripts/ncu_steps.py: one ncu profile per main-path step


def load_profiles(folder):
    """{(rung number, direction): the row of its profiled variant} from the folder's ncu_steps.csv
    ({} without one); for a rung with steps, its last row (rung 12's engine)."""
    path = os.path.join(folder, PROFILES_CSV)
    if not os.path.isfile(path):
        return {}
    with open(path, newline="") as f:
        return {(r["rung"], r["direction"]): r for r in csv.DictReader(f)}


def profile_cells(profile):
    """The table's two profile cells of one rung: the tensor pipe's active %, the top stall."""
    if profile is None or not profile.get("tensor_pipe_pct"):
        return ["–", "–" if profile is None else f"– ({profile.get('note') or 'not measured'})"]
    stall = profile.get("top_stall") or "–"
    if profile.get("top_stall_ratio"):
        stall += f" ({float(profile['top_stall_ratio']):.2f})"
    return [f"{float(profile['tensor_pipe_pct']):.1f} %", stall]


def ladder_block(rows, gpu_folder, docs_dir, pages=(), backward=False, image=None, profiles=None):
    """The markdown between the ladder markers (with backward=True: the backward ladder's).

    `rows` are the GPU folder's merged forward rows, or with backward=True its
    backward rows (None when it has no bwd.csv); `gpu_folder` names their
    source in the caption (e.g. results/H200); `docs_dir` is the docs folder
    relative to the page, with its trailing '/' ('' beside it), and `pages` the
    file names there: a rung whose page exists links to it. `image`, the path
    of the main path's bar chart relative to the page, is shown under the table.
    `profiles` (load_profiles): where given, two columns more, each main-path
    rung's tensor pipe and top stall from ncu at the table's shape.
    When the table's numbers come from more than one run (commit, day), a run
    column names each row's and the caption says which is which.
    """
    s = SHAPE
    shape = f"B={s['B']} H={s['H']} N={s['Nq']} D={s['D']}, {s['dtype']}, non-causal"
    lines = [f"<!-- generated by scripts/regenerate.py from {gpu_folder}; edit the CSVs, not this block -->"]
    if backward and rows is None:
        return "\n".join(lines + [f"Backward, {shape}: {gpu_folder} has no bwd.csv, so no backward row is timed "
                                  "(`scripts/gpu_check.sh bwd` writes it)."])
    rungs, peer_suffix = (BACKWARD_RUNGS, BWD) if backward else (FORWARD_RUNGS, "")
    fa2_name, cudnn_name = FA2 + peer_suffix, CUDNN + peer_suffix
    at, table = ladder_rows(rows, rungs)
    best = {rung.number: row for rung, row, _ in table}
    fa2, cudnn = rc.tflops(at, fa2_name), rc.tflops(at, cudnn_name)
    used = [row for _, row, _ in table if row] + [r for r in at if r["variant"] in (fa2_name, cudnn_name) and rc.ran(r)]
    gpus, commits, span = rc.provenance(used)
    names = rc.run_names(rows)  # lettered over all the rows, as the results block and the plots letter them
    runs = {key: letter for key, letter in names.items() if any(rc.run_key(r) == key for r in used)}
    several = len(runs) > 1
    source = (f"runs {rc.runs_legend(runs)}; the run column names each row's" if several
              else f"commit {commits}, {span}")
    if backward:
        lines.append(f"Backward (dQ, dK, dV), {shape}, on {gpus} ({source}), from bwd.csv. TFLOPS "
                     "(backward FLOPs, 2·B·H·(3D + 2Dv)·pairs) of each rung's best variant; × previous: over the best "
                     "variant of the rung it grows from (in brackets; none for one grown from a forward rung); × FA2, "
                     f"× cuDNN: over `{fa2_name}` and `{cudnn_name}` at the same shape.")
    else:
        lines.append(f"Forward, {shape}, on {gpus} ({source}). TFLOPS of each rung's best stage; "
                     "× previous: over the best stage of the rung it grows from (in brackets); × FA2, × cuDNN: over "
                     f"`{fa2_name}` and `{cudnn_name}` at the same shape.")
    if profiles:
        lines.append("Tensor pipe, top stall: ncu of the main path's steps at this shape "
                     f"({PROFILES_CSV}, `scripts/ncu_steps.py`: the tensor pipe's active cycles, % of peak; the "
                     "stall reason with the most warps per issued instruction, that number in brackets); – off "
                     "the main path.")
    peer_rows = [r for r in at if r["variant"] in (fa2_name, cudnn_name) and rc.ran(r)]
    lines += ["", "| rung | idea | TFLOPS | × previous | × FA2 | × cuDNN |" + (" tensor pipe | top stall |"
                                                                              if profiles else "")
              + (" run |" if several else ""),
              "|---|---|---:|---:|---:|---:|" + ("---:|---|" if profiles else "") + (":---:|" if several else "")]
    for rung, row, reason in table:
        name = f"{rung.number} `{rung.prefix}`"
        if rung.page in pages:
            name = f"[{name}]({docs_dir}{rung.page})"
        if row is None:
            cells = [f"– ({reason})", "–", "–", "–"]
        else:
            stage = stage_of(row["variant"], rung)
            if rung.parent is None:
                prev = "–"
            elif rung.parent not in best:  # it grows from a rung of the other direction
                prev = f"– ({rung.parent}: {'forward' if backward else 'backward'})"
            else:
                parent = best[rung.parent]
                prev = f"{ratio(row['tflops'], parent and parent['tflops'])} ({rung.parent})"
            cells = [f"{row['tflops']:.1f}" + (f" ({stage})" if stage else ""), prev,
                     ratio(row["tflops"], fa2), ratio(row["tflops"], cudnn)]
        if profiles:
            direction = "bwd" if backward else "fwd"
            cells += profile_cells(profiles.get((rung.number, direction))) if (
                rung.number in MAIN_PATH or backward) else ["–", "–"]
        if several:  # the runs of the row's own number and of the peers it is divided by
            cells.append(rc.runs_label(([row] + peer_rows) if row else [], names))
        lines.append("| " + " | ".join([name, rung.idea] + cells) + " |")
    if image:
        lines += ["", "![The main path at this shape, rung by rung, with FlashAttention-2 and cuDNN as lines]"
                  f"({image})"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpu_folder", help="results/<gpu>")
    ap.add_argument("--bwd", action="store_true", help="the backward rungs, from bwd.csv")
    args = ap.parse_args(argv)
    try:
        rc.load_gone_commits(os.path.dirname(os.path.abspath(args.gpu_folder)))
        rows = rc.load_bwd(args.gpu_folder) if args.bwd else rc.load_gpu(args.gpu_folder)
    except rc.CsvError as e:
        print(f"ladder.py: error: {e}", file=sys.stderr)
        return 2
    print(ladder_block(rows, args.gpu_folder, "", backward=args.bwd, profiles=load_profiles(args.gpu_folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
