#!/usr/bin/env python3
"""attnlab.flex_attention against torch's compiled flex_attention, in one
process, on the same block mask: torch's create_block_mask with the mask_mod
written in Python (attnlab.mods), handed to attnlab through
attnlab.BlockMask.from_torch, so that both walk the very same lists.

    PYTHONPATH=build/python python3 scripts/bench_blocksparse.py              # the default set
    PYTHONPATH=build/python python3 scripts/bench_blocksparse.py --B 1 --H 8 --N 8192 --cases causal,document:4

Rows per case: `blocksparse` (ours, kind rung) and `flex_attention` (torch,
torch.compile'd, kind peer), then their backward, `blocksparse bwd` and
`flex_attention bwd` (unless --no-bwd): the gradients of out·dO for a random
dO, the backward alone timed (torch.autograd.grad on a forward graph kept for
it), TFLOPS 2·B·H·(3D+2Dv)·pairs / time, each of dQ, dK, dV checked by the
rule below against eager flex_attention's autograd. Timing: CUDA events around each call, after warm-up, each call
after an L2 flush (a 256 MiB write), the calls of the two rows interleaved
round by round; the median is reported. TFLOPS: 2·B·H·(D+Dv)·pairs / time,
pairs = the (b, h, q, k) the mask_mod keeps, counted exactly on the GPU
(attnlab.kept_pairs), not the visited blocks'. The check (unless --no-check):
torch's eager flex_attention on fp32 copies is the reference, eager
flex_attention in the dtype the yardstick; a row passes when its max error is
at most 2 x the yardstick's + 2 x the reference's fp32 rounding
(tests/python/test_blocksparse.py's rule).

Default set (B=4 H=16 N=4096 D=128 bf16): causal; sliding_window:1024,0 (a
1024-key window, causal); document:4 (4 documents of random lengths from
--seed); prefix_lm:512; mini_causal:64; causal with rel_bias and with alibi.
Document+causal is not one mask_mod of mods.h, so it is not in the set.

Writes results/<gpu>/blocksparse.csv (--csv): bench.csv's columns
(docs/results.md), then `mask` and `score`; the CSV is not quoted, so a
spec's commas are written as ';' (sliding_window:1024;0).
"""
import argparse
import datetime
import os
import random
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import results_csv  # noqa: E402

CSV_COLUMNS = tuple(results_csv.COLUMNS) + ("mask", "score")
# MASK[+SCORE]; a spec's own commas written as ';' (the list is comma-separated)
DEFAULT_CASES = ("causal", "sliding_window:1024;0", "document:4", "prefix_lm:512", "mini_causal:64",
                 "causal+rel_bias", "causal+alibi")
FLUSH_BYTES = 256 << 20


def csv_text(value):
    """A CSV field as the harness writes it (bench/runner.cpp csv_field): commas, quotes and newlines become ';'."""
    return re.sub(r'[,"\n]', ";", str(value))


def gpu_slug(name):
    """results/<gpu>/ as scripts/gpu_check.sh names it: "NVIDIA H200" -> "H200"."""
    name = re.sub(r"^NVIDIA ", "", name)
    name = re.sub(r"^GeForce ", "", name)
    return re.sub(r"-$", "", re.sub(r"[^A-Za-z0-9.]+", "-", name)) or "unknown-gpu"


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def parse_case(text):
    """"mask[+score]" -> (mask spec, score spec or None, document count or 0)."""
    mask, _, score = text.replace(";", ",").partition("+")
    documents = 0
    if mask.startswith("document"):
        documents = int(mask.partition(":")[2] or 4)
        mask = "document"
    return mask, score or None, documents


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help="cases separated by commas, each MASK[+SCORE]; a spec's own commas written as ';' "
                         "(sliding_window:1024;0); document:K for K documents")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bwd", action="store_true", help="the forward rows only")
    ap.add_argument("--csv", default=None, help="default: results/<gpu>/blocksparse.csv")
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()

    import inspect

    import torch
    from torch.nn.attention import flex_attention as tf

    import attnlab
    from attnlab import mods

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    B, H, N, D = args.B, args.H, args.N, args.D
    device = torch.device("cuda")
    compiled_flex = torch.compile(tf.flex_attention)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    gpu = torch.cuda.get_device_name()
    path = None if args.no_csv else args.csv or os.path.join(ROOT, "results", gpu_slug(gpu), "blocksparse.csv")
    if path and os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, encoding="utf-8") as f:
            if f.readline().rstrip("\r\n") != ",".join(CSV_COLUMNS):
                sys.exit(f"bench_blocksparse.py: {path} has other columns than these rows' (bench.csv's, mask, "
                         "score): use another file")
    sys_fields = {
        "gpu": gpu,
        "driver": (run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines() or [""])[0],
        "cuda": f"runtime {torch.version.cuda}",
        "commit": os.environ.get("ATTNLAB_COMMIT") or run(["git", "rev-parse", "--short=12", "HEAD"]) or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }

    def time_interleaved(calls):
        """Median ms of each call: warm-up, then rounds over the calls, each after an L2 flush. A call is
        a function, or (prepare, timed): prepare() runs untimed and its result goes to timed (a
        backward's forward graph: a compiled backward cannot keep its graph for another run)."""
        calls = [c if isinstance(c, tuple) else (lambda: None, lambda _, c=c: c()) for c in calls]
        for prepare, timed in calls:
            for _ in range(args.warmup):
                timed(prepare())
        times = [[] for _ in calls]
        for _ in range(args.iters):
            for i, (prepare, timed) in enumerate(calls):
                arg = prepare()
                flush.fill_(1)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                timed(arg)
                end.record()
                end.synchronize()
                times[i].append(start.elapsed_time(end))
        return [statistics.median(t) for t in times]

    def flex_eager(q, k, v, block_mask, score_fn):
        """torch's flex_attention uncompiled (its eager path): (out, lse)."""
        if "return_aux" in inspect.signature(tf.flex_attention).parameters:
            out, aux = tf.flex_attention(q, k, v, score_mod=score_fn, block_mask=block_mask,
                                         return_aux=tf.AuxRequest(lse=True))
            return out, aux.lse
        return tf.flex_attention(q, k, v, score_mod=score_fn, block_mask=block_mask, return_lse=True)

    def rule(got, ref, low):
        """(err, tol) of one output by the rule: err = max|got - ref|, tol = 2 x max|low - ref| + floor."""
        finite = ref[torch.isfinite(ref)]
        floor = 2 * ((finite + 0.3) - 0.3 - finite).abs().max().item() if finite.numel() else 0.0
        return (got.float() - ref).abs().max().item(), 2 * (low.float() - ref).abs().max().item() + floor

    def gradients(forward, q, k, v, dout):
        """dQ, dK, dV of out·dO through `forward` (a function of q, k, v)."""
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(forward(*leaves), leaves, dout)

    def add_row(name, kind, ms, flops, ms_peer, check, spec_mask, score, note):
        tflops = flops / (ms * 1e-3) / 1e12
        err, tol = check if check else (None, None)
        status = "unchecked" if err is None else ("PASS" if err <= tol else "FAIL")
        rows.append({**sys_fields, "variant": name, "kind": kind, "B": B, "H": H, "Nq": N, "Nk": N, "D": D,
                     "Dv": D, "dtype": args.dtype, "causal": int(spec_mask == "causal"), "time_ms": f"{ms:.6f}",
                     "tflops": f"{tflops:.2f}", "ratio_to_best_peer": f"{ms_peer / ms:.3f}" if kind == "rung" else "",
                     "status": status, "max_err": "" if err is None else f"{err:.3e}",
                     "tol": "" if tol is None else f"{tol:.3e}", "lse_err": "", "seed": args.seed,
                     "note": note, "mask": spec_mask, "score": score or "none"})
        print(f"{spec_mask + ('+' + score if score else ''):>28} {name:>20}: time:{ms:.6f}ms, "
              f"TFLOPS:{tflops:<8.2f} {status}" + ("" if err is None else f" err {err:.2e} (tol {tol:.2e})"))

    rows = []
    print(f"block-sparse forward and backward: B={B} H={H} N={N} D={D} {args.dtype} on {gpu}; torch {torch.__version__}; "
          f"seed {args.seed}")
    for n, text in enumerate(c for c in args.cases.split(",") if c):
        mask, score, documents = parse_case(text)
        torch.manual_seed(args.seed + n)
        q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype) for _ in range(3))
        doc_ids = None
        if mask == "document":
            ids = mods.random_document_ids(B, N, documents, random.Random(args.seed + n))
            doc_ids = torch.tensor(ids, dtype=torch.int32, device=device)
        mask_fn = mods.torch_mask_mod(mask, N, N, doc_ids)
        score_fn = mods.torch_score_mod(score, H)
        mask_B = B if doc_ids is not None else None
        torch_bm = tf.create_block_mask(mask_fn, mask_B, None, N, N, device=device)
        ours_bm = attnlab.BlockMask.from_torch(torch_bm, mask_mod=mask, doc_ids=doc_ids)
        pairs = attnlab.kept_pairs(mask, B, H, N, N, doc_ids=doc_ids)
        flops = 2.0 * (D + D) * pairs

        def ours():
            return attnlab.flex_attention(q, k, v, block_mask=ours_bm, score_mod=score)

        def theirs():
            return compiled_flex(q, k, v, score_mod=score_fn, block_mask=torch_bm)

        checks = {}
        if not args.no_check:
            ref, _ = flex_eager(q.float(), k.float(), v.float(), torch_bm, score_fn)
            low, _ = flex_eager(q, k, v, torch_bm, score_fn)
            for name, call in (("blocksparse", ours), ("flex_attention", theirs)):
                checks[name] = rule(call(), ref, low)
            del ref, low
        ms_ours, ms_theirs = time_interleaved([ours, theirs])
        spec_mask = f"document:{documents}" if mask == "document" else mask
        note = (f"same block mask (torch's create_block_mask; {ours_bm.sparsity():.1f}% of blocks empty); "
                f"pairs kept {100.0 * pairs / (B * H * N * N):.2f}%")
        add_row("flex_attention", "peer", ms_theirs, flops, ms_theirs, checks.get("flex_attention"), spec_mask,
                score, note)
        add_row("blocksparse", "rung", ms_ours, flops, ms_theirs, checks.get("blocksparse"), spec_mask, score, note)
        print(f"{'':>28} {'':>20}  blocksparse / flex_attention: {ms_theirs / ms_ours:.2f}x")
        if args.no_bwd:
            continue

        # The backward: each side's forward run untimed, its backward alone timed.
        dout = torch.randn(B, H, N, D, device=device, dtype=dtype)
        forwards = {"blocksparse": lambda a, b, c: attnlab.flex_attention(a, b, c, block_mask=ours_bm, score_mod=score),
                    "flex_attention": lambda a, b, c: compiled_flex(a, b, c, score_mod=score_fn, block_mask=torch_bm)}
        bwd_checks = {}
        if not args.no_check:
            def eager(a, b, c):
                return flex_eager(a, b, c, torch_bm, score_fn)[0]
            ref = gradients(eager, q.float(), k.float(), v.float(), dout.float())
            low = gradients(eager, q, k, v, dout)
            for name, forward in forwards.items():
                per = [rule(g, r, l) for g, r, l in zip(gradients(forward, q, k, v, dout), ref, low)]
                failing = [(e, t) for e, t in per if e > t]
                bwd_checks[name] = failing[0] if failing else max(per, key=lambda et: et[0] / max(et[1], 1e-30))
            del ref, low

        def graph(forward):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            return forward(*leaves), leaves

        calls = [(lambda f=forwards[name]: graph(f), lambda g: torch.autograd.grad(g[0], g[1], dout))
                 for name in ("blocksparse", "flex_attention")]
        ms_ours, ms_theirs = time_interleaved(calls)
        bwd_flops = 2.0 * (3 * D + 2 * D) * pairs
        add_row("flex_attention bwd", "peer", ms_theirs, bwd_flops, ms_theirs, bwd_checks.get("flex_attention"),
                spec_mask, score, note)
        add_row("blocksparse bwd", "rung", ms_ours, bwd_flops, ms_theirs, bwd_checks.get("blocksparse"), spec_mask,
                score, note)
        print(f"{'':>28} {'':>20}  blocksparse bwd / flex_attention bwd: {ms_theirs / ms_ours:.2f}x")

    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        with open(path, "a", encoding="utf-8") as f:
            if new:
                f.write(",".join(CSV_COLUMNS) + "\n")
            for row in rows:
                f.write(",".join(csv_text(row[c]) for c in CSV_COLUMNS) + "\n")
        print(f"{len(rows)} rows -> {os.path.relpath(path, ROOT)}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
