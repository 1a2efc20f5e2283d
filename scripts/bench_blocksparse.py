#!/usr/bin/env python3
"""attnlab.flex_attention against torch's compiled flex_attention, in one
process, on the same block mask: torch's create_block_mask with the mask_mod
written in Python (attnlab.mods), handed to attnlab through
attnlab.BlockMask.from_torch, so that both walk the very same lists; and
dmattn (attnlab.dynamic_mask_attention) against compiled flex_attention on
the same top-W mask (cases dmattn_topk:...).

    PYTHONPATH=build/python python3 scripts/bench_blocksparse.py              # the default set
    PYTHONPATH=build/python python3 scripts/bench_blocksparse.py --B 1 --H 8 --N 8192 --cases causal,document:4
    PYTHONPATH=build/python python3 scripts/bench_blocksparse.py --cases dmattn_topk:1024,dmattn_topk:256

Rows per case: `blocksparse` (ours, kind rung), `flex_attention` (torch,
torch.compile'd on its Triton backend, kind peer) and `flex_attention(flash)`
(the same compiled on FlashAttention-4's kernels, kernel_options={"BACKEND":
"FLASH"}, kind peer: where torch refuses the mask or score on that backend, or
flash-attn-4 is not installed, a row `unsupported` with torch's reason), then
their backward, `blocksparse bwd`, `flex_attention bwd` and
`flex_attention(flash) bwd` (unless --no-bwd): the gradients of out·dO for a
random dO, the backward alone timed (torch.autograd.grad on a forward graph
kept for it), TFLOPS 2·B·H·(3D+2Dv)·pairs / time, each of dQ, dK, dV checked
by the rule below against eager flex_attention's autograd. Our rows' ratio to
the best peer is to the faster flex that passed. Timing (gpu_timing.py, the
harness's rule): CUDA events around each call, after warm-up, each call after
an L2 flush and a queued GPU delay, so the events measure GPU time alone, the
calls of a case's rows interleaved round by round; the median is reported.
TFLOPS: 2·B·H·(D+Dv)·pairs / time,
pairs = the (b, h, q, k) the mask_mod keeps, counted exactly on the GPU
(attnlab.kept_pairs), not the visited blocks'. The check (unless --no-check):
torch's eager flex_attention on fp32 copies is the reference, eager
flex_attention in the dtype the yardstick; a row passes when its max error is
at most 2 x the yardstick's + 2 x the reference's rounding to the output's
dtype (tests/python/flex_reference.py's rule).

Default set (B=4 H=16 N=4096 D=128 bf16): causal; sliding_window:1024,0 (a
1024-key window, causal); document:4 (4 documents of random lengths from
--seed); prefix_lm:512; mini_causal:64; causal with rel_bias and with alibi;
dmattn_topk:1024 (below). Document+causal is not one mask_mod of mods.h, so it
is not in the set. Each case compiles flex anew (its mask_mod and score_mod are
new functions): torch.compile's recompile limit is raised so that no case falls
back to flex's eager path, which would time the peer at a fraction of its speed.

dmattn cases, dmattn_topk[:W[;BLOCK]] (each ~25 s on an H200, most of it
flex's compile): flash-dmattn's dynamic mask as flash_attn_mma builds it (--mask topk
--window W --block BLOCK, defaults 1024 and 64; BLOCK 0 = plain top-W): a
random bias [B, H, 1, N], per query the W causal keys of largest bias, then
each BLOCK-key block kept whole where more than half its keys were, as one
dense bool mask [B, H, N, N]. docs/dmattn_forward.md's train table is
dmattn_topk:1024 over N, its window table dmattn_topk:W over W. Rows `dmattn`
(kind rung: dynamic_mask_attention with that attn_mask, the bias as
attn_bias, is_causal), `blocksparse` (kind rung: attnlab.flex_attention,
the mask a tensor mask_mod on the BlockMask below, the bias a tensor
score_mod: dmattn's problem on the block-sparse engine) and `flex_attention`
(kind peer: create_block_mask, BLOCK_SIZE 128, of a mask_mod that reads the
same tensor, mask[b, h, q, kv], and a score_mod that adds bias[b, h, 0, kv]),
then the three backward rows. This is the fair peer for a sparse mask: flex skips the
empty blocks and reads the mask only in partial ones, as dmattn does, where
SDPA given an additive float mask (flash_attn_mma's torch peers) computes
every pair. Each side's block summary is built once, untimed, as it would be
for a mask shared by layers: the BlockMask, and dmattn's tile summary
(attnlab.build_mask_summary, passed as mask_summary). The bias requires no
grad, so neither side computes one: the backward rows are dQ, dK, dV, as a
flex score_mod gives a captured tensor no gradient unless it requires one.
pairs = mask.sum(), exactly; the check as above, the reference eager
flex_attention with the same mask_mod and score_mod.

Writes results/<gpu>/blocksparse.csv (--csv): bench.csv's columns
(docs/results.md), then `mask` and `score`; the CSV is not quoted, so a
spec's commas are written as ';' (sliding_window:1024;0). dmattn rows:
mask dmattn_topk:W;BLOCK, score bias, causal 1. The output's first line and
every row's note end with the software line (run_info.py: torch, cuDNN, CUDA,
driver, flash-attn-4, CUTLASS DSL), which says which flex backends could run.
"""
import argparse
import math
import os
import random
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))  # flex_reference: the checks' rounding floor
import results_csv  # noqa: E402
import run_info  # noqa: E402

CSV_COLUMNS = tuple(results_csv.COLUMNS) + ("mask", "score")
# MASK[+SCORE]; a spec's own commas written as ';' (the list is comma-separated)
DEFAULT_CASES = ("causal", "sliding_window:1024;0", "document:4", "prefix_lm:512", "mini_causal:64",
                 "causal+rel_bias", "causal+alibi", "dmattn_topk:1024")
FLEX, FLEX_FLASH = "flex_attention", "flex_attention(flash)"
FLASH_OPTIONS = {"BACKEND": "FLASH"}  # torch's flex_attention on FlashAttention-4's CuTe DSL kernels
DMATTN_TOPK = "dmattn_topk"
TOPK_DEFAULTS = (1024, 64)  # flash_attn_mma's --window and --block (bench/cli.h)
TOPK_SLICE = 1 << 25        # scores sorted at a time by topk_mask (rows of queries: 128 at B=4 H=16 N=4096)


def parse_case(text):
    """"mask[+score]" -> (mask spec, score spec or None, document count or 0)."""
    mask, _, score = text.replace(";", ",").partition("+")
    documents = 0
    if mask.startswith("document"):
        documents = int(mask.partition(":")[2] or 4)
        mask = "document"
    return mask, score or None, documents


def parse_dmattn_case(text):
    """"dmattn_topk[:W[;BLOCK]]" (or ',') -> (W, BLOCK), TOPK_DEFAULTS where left out; anything else a
    one-line ValueError."""
    m = re.fullmatch(DMATTN_TOPK + r"(?::(\d+)(?:[,;](\d+))?)?", text)
    if not m or m[1] is not None and int(m[1]) < 1:
        raise ValueError(f"a dmattn case is {DMATTN_TOPK}[:W[;BLOCK]] (W >= 1 keys per query, BLOCK >= 0 keys, "
                         f"no score), got '{text}'")
    return tuple(TOPK_DEFAULTS[i] if g is None else int(g) for i, g in enumerate(m.groups()))


def topk_mask(bias, window, block):
    """flash-dmattn's dynamic mask as dma_build_topk_mask builds it (build_topk_mask_cpu's rule): per query i,
    the `window` keys j <= i of largest bias (ties: the lower key), then with block > 0 each `block`-key block
    kept whole (its keys j <= i) where more than half of its keys were kept, else dropped. bias [B, H, 1, N]
    -> bool [B, H, N, N], sorted a slice of query rows at a time."""
    import torch
    import torch.nn.functional as F

    B, H, _, N = bias.shape
    keys = torch.arange(N, device=bias.device)
    mask = torch.empty(B, H, N, N, dtype=torch.bool, device=bias.device)
    rows = max(1, TOPK_SLICE // (B * H * N))
    for i0 in range(0, N, rows):
        query = keys[i0:i0 + rows, None]
        causal = keys <= query
        order = bias.float().masked_fill(~causal, -math.inf).sort(dim=-1, descending=True, stable=True).indices
        kept = torch.zeros_like(order, dtype=torch.bool).scatter_(-1, order, (keys <= query.clamp(max=window - 1))
                                                                   .expand_as(order))
        if block:
            votes = F.pad(kept, (0, -N % block)).unflatten(-1, (-1, block)).sum(-1)
            kept = (2 * votes > (N - keys[::block]).clamp(max=block)).repeat_interleave(block, -1)[..., :N] & causal
        mask[:, :, i0:i0 + rows] = kept
    return mask


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help="cases separated by commas, each MASK[+SCORE]; a spec's own commas written as ';' "
                         "(sliding_window:1024;0); document:K for K documents; dmattn_topk[:W[;BLOCK]] for dmattn "
                         "on its top-W mask")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bwd", action="store_true", help="the forward rows only")
    ap.add_argument("--csv", default=None, help="default: results/<gpu>/blocksparse.csv")
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for text in (c for c in cases if c.startswith("dmattn")):
        try:
            parse_dmattn_case(text)
        except ValueError as e:
            ap.error(str(e))

    import inspect

    import torch
    from torch.nn.attention import flex_attention as tf

    import attnlab
    from attnlab import mods
    from flex_reference import rounding_floor
    from gpu_timing import Timer

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    B, H, N, D = args.B, args.H, args.N, args.D
    device = torch.device("cuda")
    for limit in ("recompile_limit", "cache_size_limit"):  # the name differs between torch versions
        if hasattr(torch._dynamo.config, limit):  # (each case compiles both flex backends, forward and backward)
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 128))
    compiled_flex = torch.compile(tf.flex_attention)
    timer = Timer(torch, device)
    gpu = torch.cuda.get_device_name()
    path = None if args.no_csv else args.csv or os.path.join(ROOT, "results", run_info.gpu_slug(gpu),
                                                             "blocksparse.csv")
    if path and os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, encoding="utf-8") as f:
            if f.readline().rstrip("\r\n") != ",".join(CSV_COLUMNS):
                sys.exit(f"bench_blocksparse.py: {path} has other columns than these rows' (bench.csv's, mask, "
                         "score): use another file")
    versions = run_info.software(torch)
    software = run_info.software_line(versions)
    sys_fields = run_info.system_fields(gpu, versions)

    def time_interleaved(calls):
        """Median ms of each call (None where it raised: its error, the first line, in errors) by the
        harness's rule (gpu_timing.py). A call is a function, or (prepare, timed): prepare() runs untimed
        and its result goes to timed (a backward's forward graph: a compiled backward cannot keep its graph
        for another run)."""
        return timer.time_interleaved(calls, args.warmup, args.iters)

    def flex_eager(q, k, v, block_mask, score_fn):
        """torch's flex_attention uncompiled (its eager path): (out, lse)."""
        if "return_aux" in inspect.signature(tf.flex_attention).parameters:
            out, aux = tf.flex_attention(q, k, v, score_mod=score_fn, block_mask=block_mask,
                                         return_aux=tf.AuxRequest(lse=True))
            return out, aux.lse
        return tf.flex_attention(q, k, v, score_mod=score_fn, block_mask=block_mask, return_lse=True)

    def rule(got, ref, low):
        """(err, tol) of one output by the rule: err = max|got - ref|, tol = 2 x max|low - ref| + floor."""
        return (got.float() - ref).abs().max().item(), 2 * (low.float() - ref).abs().max().item() + rounding_floor(
            ref, got.dtype)

    def gradients(forward, q, k, v, dout):
        """dQ, dK, dV of out·dO through `forward` (a function of q, k, v)."""
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(forward(*leaves), leaves, dout)

    def add_row(name, kind, ms, flops, ms_peer, check, case, status=None, why=""):
        """One row of the CSV and its line; case: the case's mask, score, causal and note columns. ms None: a
        row that did not run, its status (unsupported, error) and why in `status` and `why`."""
        err, tol = check if check else (None, None)
        if status is None:
            status = "unchecked" if err is None else ("PASS" if err <= tol else "FAIL")
        ran = ms is not None
        tflops = flops / (ms * 1e-3) / 1e12 if ran else None
        rows.append({**sys_fields, "variant": name, "kind": kind, "B": B, "H": H, "Nq": N, "Nk": N, "D": D,
                     "Dv": D, "dtype": args.dtype, "causal": int(case["causal"]), "time_ms": f"{ms:.6f}" if ran else "",
                     "tflops": f"{tflops:.2f}" if ran else "",
                     "ratio_to_best_peer": f"{ms_peer / ms:.3f}" if kind == "rung" and ran and ms_peer else "",
                     "status": status, "max_err": "" if err is None else f"{err:.3e}",
                     "tol": "" if tol is None else f"{tol:.3e}", "lse_err": "", "seed": args.seed,
                     "note": "; ".join(p for p in (why, case["note"], software) if p), "mask": case["mask"],
                     "score": case["score"] or "none"})
        label = case['mask'] + ('+' + case['score'] if case['score'] else '')
        if not ran:
            print(f"{label:>28} {name:>20}: {status}: {why}")
            return
        print(f"{label:>28} {name:>20}: time:{ms:.6f}ms, TFLOPS:{tflops:<8.2f} {status}"
              + ("" if err is None else f" err {err:.2e} (tol {tol:.2e})"))

    def normal(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    def passed(check):
        return check is None or check[0] <= check[1]

    def rows_of(ours, peers, refused, ms, errors, checks, flops, case, suffix=""):
        """The rows of one direction of a case: the peers', then ours with the ratio to the faster peer that
        ran and passed; `refused`: {peer: torch's reason} of the peers that did not run."""
        best_peer = min((ms[p] for p in peers if ms.get(p) and passed(checks.get(p))), default=None)
        for name in peers:
            if name in refused:
                add_row(name + suffix, "peer", None, flops, None, None, case, "unsupported", refused[name])
            elif errors[name]:
                add_row(name + suffix, "peer", None, flops, None, None, case, "error", errors[name])
            else:
                add_row(name + suffix, "peer", ms[name], flops, None, checks.get(name), case)
        for name in ours:
            if errors[name]:
                add_row(name + suffix, "rung", None, flops, None, None, case, "error", errors[name])
                continue
            add_row(name + suffix, "rung", ms[name], flops, best_peer, checks.get(name), case)
            for peer in (p for p in peers if ms.get(p)):
                print(f"{'':>28} {'':>20}  {name + suffix} / {peer + suffix}: {ms[peer] / ms[name]:.2f}x")

    def compare(ours, q, k, v, block_mask, score_fn, pairs, case):
        """One case's rows: each of `ours` ({rung name: f(q, k, v) -> out}) and compiled flex_attention on
        block_mask and score_fn (the peers: its Triton backend and, where torch accepts the mods there,
        FlashAttention-4's), forward, then (unless --no-bwd) backward, each checked against eager
        flex_attention on the same."""
        peers = {FLEX: lambda a, b, c: compiled_flex(a, b, c, score_mod=score_fn, block_mask=block_mask),
                 FLEX_FLASH: lambda a, b, c: compiled_flex(a, b, c, score_mod=score_fn, block_mask=block_mask,
                                                           kernel_options=FLASH_OPTIONS)}
        refused = {}  # a trial call of the FLASH backend (its compile, untimed): torch's refusal, one line

        def trial(name, call):
            if name in refused:
                return
            try:
                call()
                torch.cuda.synchronize()
            except Exception as e:
                refused[name] = run_info.first_line(e) or type(e).__name__

        trial(FLEX_FLASH, lambda: peers[FLEX_FLASH](q, k, v))
        forwards = {**ours, **{name: f for name, f in peers.items() if name not in refused}}

        def eager(a, b, c):
            return flex_eager(a, b, c, block_mask, score_fn)[0]

        checks = {}
        if not args.no_check:
            ref, low = eager(q.float(), k.float(), v.float()), eager(q, k, v)
            checks = {variant: rule(forward(q, k, v), ref, low) for variant, forward in forwards.items()}
            del ref, low
        times, errors = time_interleaved([lambda f=f: f(q, k, v) for f in forwards.values()])
        rows_of(ours, peers, refused, dict(zip(forwards, times)), dict(zip(forwards, errors)), checks,
                2.0 * (D + D) * pairs, case)
        if args.no_bwd:
            return

        # The backward: each side's forward run untimed, its backward alone timed.
        dout = normal(B, H, N, D)
        trial(FLEX_FLASH, lambda: gradients(peers[FLEX_FLASH], q, k, v, dout))
        backwards = {name: f for name, f in forwards.items() if name not in refused}
        bwd_checks = {}
        if not args.no_check:
            ref = gradients(eager, q.float(), k.float(), v.float(), dout.float())
            low = gradients(eager, q, k, v, dout)
            for variant, forward in backwards.items():
                per = [rule(g, r, l) for g, r, l in zip(gradients(forward, q, k, v, dout), ref, low)]
                failing = [(e, t) for e, t in per if e > t]
                bwd_checks[variant] = failing[0] if failing else max(per, key=lambda et: et[0] / max(et[1], 1e-30))
            del ref, low

        def graph(forward):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            return forward(*leaves), leaves

        calls = [(lambda f=f: graph(f), lambda g: torch.autograd.grad(g[0], g[1], dout)) for f in backwards.values()]
        times, errors = time_interleaved(calls)
        rows_of(ours, peers, refused, dict(zip(backwards, times)), dict(zip(backwards, errors)), bwd_checks,
                2.0 * (3 * D + 2 * D) * pairs, case, " bwd")

    def blocksparse_case(n, text):
        """compare's arguments for MASK[+SCORE]: attnlab.flex_attention on torch's BlockMask of the mods' mask_mod."""
        mask, score, documents = parse_case(text)
        torch.manual_seed(args.seed + n)
        q, k, v = (normal(B, H, N, D) for _ in range(3))
        doc_ids = None
        if mask == "document":
            ids = mods.random_document_ids(B, N, documents, random.Random(args.seed + n))
            doc_ids = torch.tensor(ids, dtype=torch.int32, device=device)
        mask_fn = mods.torch_mask_mod(mask, N, N, doc_ids)
        mask_B = B if doc_ids is not None else None
        torch_bm = tf.create_block_mask(mask_fn, mask_B, None, N, N, device=device)
        ours_bm = attnlab.BlockMask.from_torch(torch_bm, mask_mod=mask, doc_ids=doc_ids)
        pairs = attnlab.kept_pairs(mask, B, H, N, N, doc_ids=doc_ids)

        def ours(a, b, c):
            return attnlab.flex_attention(a, b, c, block_mask=ours_bm, score_mod=score)

        note = (f"same block mask (torch's create_block_mask; {ours_bm.sparsity():.1f}% of blocks empty); "
                f"pairs kept {100.0 * pairs / (B * H * N * N):.2f}%")
        case = {"mask": f"document:{documents}" if mask == "document" else mask, "score": score,
                "causal": mask == "causal", "note": note}
        return {"blocksparse": ours}, q, k, v, torch_bm, mods.torch_score_mod(score, H), pairs, case

    def dmattn_case(n, text):
        """compare's arguments for dmattn_topk:W,BLOCK: dmattn on the top-W mask of a bias [B, H, 1, N] (its tile
        summary built beforehand), the block-sparse engine on the same mask as a tensor mask_mod (torch's
        BlockMask of it) and the bias as a tensor score_mod, flex on that BlockMask and a score_mod adding the
        same bias."""
        window, block = parse_dmattn_case(text)
        torch.manual_seed(args.seed + n)
        q, k, v = (normal(B, H, N, D) for _ in range(3))
        bias = normal(B, H, 1, N)
        mask = topk_mask(bias, window, block)
        summary = attnlab.build_mask_summary(q, k, mask, is_causal=True)
        block_mask = tf.create_block_mask(lambda b, h, q_idx, kv_idx: mask[b, h, q_idx, kv_idx], B, H, N, N,
                                          device=device)
        pairs = int(mask.sum())

        def ours(a, b, c):
            return attnlab.dynamic_mask_attention(a, b, c, attn_mask=mask, attn_bias=bias, is_causal=True,
                                                  mask_summary=summary)

        engine_bm = attnlab.BlockMask.from_torch(block_mask, mask_mod=attnlab.pack_mask(mask))

        def engine(a, b, c):
            return attnlab.flex_attention(a, b, c, block_mask=engine_bm, score_mod=bias)

        def score_fn(score, b, h, q_idx, kv_idx):
            return score + bias[b, h, 0, kv_idx]

        note = (f"same mask (bool [B H N N]: the top {window} keys of a bias [B H 1 N]; {block}-key blocks by "
                f"majority); flex: its BlockMask ({block_mask.sparsity():.1f}% of blocks empty); dmattn: its tile "
                f"summary given; pairs kept {100.0 * pairs / (B * H * N * N):.2f}%")
        case = {"mask": f"{DMATTN_TOPK}:{window},{block}", "score": "bias", "causal": True, "note": note}
        return {"dmattn": ours, "blocksparse": engine}, q, k, v, block_mask, score_fn, pairs, case

    rows = []
    print(f"block-sparse forward and backward: B={B} H={H} N={N} D={D} {args.dtype} on {gpu}; seed {args.seed}; "
          f"software: {software}")
    for n, text in enumerate(cases):
        compare(*(dmattn_case if text.startswith("dmattn") else blocksparse_case)(n, text))

    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        with open(path, "a", encoding="utf-8") as f:
            if new:
                f.write(",".join(CSV_COLUMNS) + "\n")
            for row in rows:
                f.write(",".join(run_info.csv_text(row[c]) for c in CSV_COLUMNS) + "\n")
        print(f"{len(rows)} rows -> {os.path.relpath(path, ROOT)}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
