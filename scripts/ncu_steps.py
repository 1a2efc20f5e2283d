#!/usr/bin/env python3
"""One ncu profile per step of the main path: what limits each step, as numbers.

    python3 scripts/ncu_steps.py --bin build/flash_attn_mma --csv results/H200/ncu_steps.csv
    python3 scripts/ncu_steps.py --parse ncu_raw.csv    # the columns read from one ncu --page raw CSV

At B = 1 H = 8 N = 8192 D = 128 fp16 (--N, --D to change), each step's kernel (STEPS: rungs
00, 01, 02, 07, rung 12's steps and engine, the backward rungs 13 and 14) is profiled once by
ncu (one launch, clocks left alone: --clock-control none), and one row per step is written:
the kernel's duration, the tensor pipe's active cycles (% of peak, the metric that counts
mma.sync and wgmma alike on Hopper), the issue slots used, the shared-memory wavefronts, and
the top stall reason with its warps per issued instruction (the WarpStateStats section's
`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`, 'selected' left out:
that warp issued). `scripts/gpu_check.sh bench` runs it (NCU=0: not); scripts/ladder.py
shows the tensor pipe and the top stall as columns of the ladder table.

Exit: 0 when every step was profiled (a step whose kernel ncu did not find is a row with its
reason), 2 on bad options, 3 when ncu is not found.
"""
import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ladder  # noqa: E402

# (rung, variant, ncu's kernel-name filter, backward): the main path in the order a learner climbs it,
# rung 12 as its page's steps (ladder.STEPS) and then the engine.
STEPS = (
    ("00", "minimal", "minimal_kernel", False),
    ("01", "split-kv+stage2", "split_kv_kernel", False),
    ("02", "split-q+stage2", "split_q_kernel", False),
    ("07", "wgmma+stage2+overlap", "wgmma_overlap_kernel", False),
    *((ladder.ENGINE, step, "ws_kernel", False) for step in ladder.STEPS["ws"]),
    (ladder.ENGINE, "ws+stage2+pingpong", "ws_kernel", False),
    ("13", "bwd-mma", "bwd_mma_kernel", True),
    ("14", "bwd-ws", "bwd_ws_kernel", True),
)
METRICS = ("gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum")
STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$")
COLUMNS = ("rung", "variant", "direction", "B", "H", "N", "D", "dtype", "duration_us", "tensor_pipe_pct",
           "issue_active_pct", "smem_wavefronts", "top_stall", "top_stall_ratio", "note")


def number(text):
    """ncu's value ("1,234.5", "n/a", "") as a float, or None."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def parse_raw(text):
    """The profile of the first kernel in an `ncu --csv --page raw` output: a dict of COLUMNS'
    measured fields (None where ncu gave none), or None when the output has no kernel row."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]  # ncu's own lines start with ==
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:  # the header, the units, then one row per kernel
        return None
    head, units, first = rows[0], rows[1], rows[2]
    value = dict(zip(head, first))
    unit = dict(zip(head, units))
    duration = number(value.get(METRICS[0]))
    if duration is not None:  # to µs, whichever unit ncu chose
        duration *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit.get(METRICS[0]), 1.0)
    stalls = {}
    for name, text in value.items():
        m = STALL.match(name)
        if m and m["reason"] != "selected" and number(text) is not None:
            stalls[m["reason"]] = number(text)
    top = max(stalls, key=lambda r: (stalls[r], r), default=None)
    return {"duration_us": duration, "tensor_pipe_pct": number(value.get(METRICS[1])),
            "issue_active_pct": number(value.get(METRICS[2])), "smem_wavefronts": number(value.get(METRICS[3])),
            "top_stall": top, "top_stall_ratio": stalls.get(top)}


def profile(ncu, binary, step, B, H, N, D, seconds):
    """One step's row: ncu on the harness running that step's variant alone, one launch."""
    rung, variant, kernel, backward = step
    cmd = [ncu, "--clock-control", "none", "-k", f"regex:{kernel}", "-c", "1", "--section", "WarpStateStats",
           "--metrics", ",".join(METRICS), "--csv", "--page", "raw",
           binary, "--B", str(B), "--H", str(H), "--N", str(N), "--D", str(D), "--variant", variant,
           "--iters", "1", "--warmup", "0", "--no-check", "--no-peers"] + (["--bwd"] if backward else [])
    row = {"rung": rung, "variant": variant, "direction": "bwd" if backward else "fwd", "B": B, "H": H, "N": N,
           "D": D, "dtype": "fp16", "note": ""}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        row["note"] = f"ncu ran over {seconds} s"
        return row
    measured = parse_raw(out.stdout)
    if measured is None:
        last = (out.stdout + out.stderr).strip().splitlines()
        row["note"] = "no kernel profiled: " + (last[-1] if last else f"exit {out.returncode}")
    else:
        row.update(measured)
    return row


def fmt(v):
    return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/flash_attn_mma")
    ap.add_argument("--csv", help="where the rows go (default: print them)")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--seconds", type=int, default=120, help="per step")
    ap.add_argument("--parse", metavar="RAW_CSV", help="only read one ncu --page raw output and print its fields")
    args = ap.parse_args(argv)
    if args.parse:
        with open(args.parse) as f:
            print(parse_raw(f.read()))
        return 0
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu_steps: ncu not found: no profiles", file=sys.stderr)
        return 3
    if not os.access(args.bin, os.X_OK):
        print(f"ncu_steps: {args.bin} is not an executable harness", file=sys.stderr)
        return 2
    rows = [profile(ncu, args.bin, s, args.B, args.H, args.N, args.D, args.seconds) for s in STEPS]
    out = open(args.csv, "w", newline="") if args.csv else sys.stdout
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([fmt(r.get(c)) for c in COLUMNS])
    if args.csv:
        out.close()
        for r in rows:
            print(f"{r['variant']:>28}: " + (r["note"] or f"{fmt(r['duration_us'])} µs, tensor pipe "
                                                         f"{fmt(r['tensor_pipe_pct'])} %, top stall {r['top_stall']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
