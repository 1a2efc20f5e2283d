#!/usr/bin/env python3
"""FlashAttention-4 as a peer of the harness: rows `fa4` (forward) and `fa4 bwd`
(backward), appended to the harness's results CSV, timed and checked as the
harness times and checks its torch peers.

    python3 scripts/bench_peers.py                                   # B=1 H=8 N=8192 D=128 fp16, forward
    python3 scripts/bench_peers.py --shape "--B 1 --H 32 --Hkv 8 --N 8192 --D 128 --causal" --shape "..."
    python3 scripts/bench_peers.py --bwd --csv results/H200/bwd.csv \\
        --shape "--B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16"

The harness (C++) cannot call FlashAttention-4's CuTe DSL kernels, so this
script runs them beside it: `scripts/gpu_check.sh bench` and `bwd` run it
after the harness on the same shapes (each --shape is the harness's options,
verbatim: --B --H --Hkv --N --Nq --Nk --D --Dv --dtype --causal, and
--no-check for a shape timed only), appending to bench.csv and bwd.csv
(default: results/<gpu>/bench.csv, or bwd.csv with --bwd) rows of the
harness's columns (results_csv.COLUMNS) with kind `peer`, so every table that
reads a best peer reads FlashAttention-4 too. The package is optional
(`pip install attnlab[peers]`: flash-attn-4 and its CUTLASS DSL); without it
the script says so in one line and exits 0.

FlashAttention-4 is `flash_attn.cute.flash_attn_func(q, k, v, softmax_scale=,
causal=)` on [B, N, H, D] tensors (its own layout; K and V of Hkv heads for
GQA), returning (out, lse); its causal mask is bottom-right aligned, as the
harness's. The backward goes through autograd: each timed call is
torch.autograd.grad(out, (q, k, v), dO) on a forward graph built untimed for
it, with a fresh random dO.

Timing (gpu_timing.py, the harness's rule): warm-up, then --iters rounds,
each call after an L2 flush and a queued GPU delay, between CUDA events; the
median. The first call at a shape compiles FlashAttention-4's kernels (its
CuTe DSL JIT): it is made, and its wall time printed, before any timed call.
Each round also times sdpa(cudnn) on the same inputs ([B, H, N, D] copies),
where cuDNN runs the shape: the ratio to it is printed and noted, a ratio
measured in one process (the harness's own sdpa(cudnn) row is another
process's). TFLOPS: the harness's convention, forward 2·B·H·(D + Dv)·pairs,
backward 2·B·H·(3D + 2Dv)·pairs, pairs = the exact count of unmasked (query,
key) pairs, causal bottom-right aligned (query i sees key j iff
j <= i + Nk - Nq).

The check (unless --no-check), the harness's rule for every row: an fp32
unfused reference (softmax(q·kᵀ·scale)·v, and its autograd gradients for the
same dO), torch's unfused path in the inputs' dtype the yardstick; each output
(O; dQ, dK, dV) passes when max|ours - ref| <= 2·max|yardstick - ref| + the
rounding floor (twice the output's own rounding, FlashAttention's form, as
tests/python/flex_reference.py takes it), nothing NaN, and FlashAttention-4's LSE within 1e-3
of the reference's. A failing row is written with its verdict (FAIL); a shape
FlashAttention-4 refuses is a row `unsupported` with its reason, as the
harness writes its peers'. Each row's note ends with the software line
(run_info.py: torch, cuDNN, CUDA, driver, flash-attn-4, CUTLASS DSL).

Exit: 0 when every row passed or was unsupported, and when flash-attn-4 or
torch is not installed; 1 when a row FAILED; 2 on bad options (one line); 3
without a usable GPU.
"""
import argparse
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import results_csv as rc  # noqa: E402
import run_info  # noqa: E402

FA4, FA4_BWD = "fa4", "fa4 bwd"
YARDSTICK = "sdpa(cudnn)"
INSTALL = "pip install attnlab[peers]"
DEFAULT_SHAPE = "--B 1 --H 8 --N 8192 --D 128"
LSE_TOL = 1e-3  # the harness's bound on the LSE (kernels/reference/reference.h)
DTYPES = ("fp16", "bf16")


class BadInput(ValueError):
    """Options this script cannot run: one line, exit 2."""


@dataclass(frozen=True)
class Shape:
    """One problem, as the harness's options give it."""
    B: int = 1
    H: int = 8
    Hkv: int = 0  # 0: H (no GQA)
    Nq: int = 8192
    Nk: int = 8192
    D: int = 128
    Dv: int = 0  # 0: D
    dtype: str = "fp16"
    causal: bool = False
    check: bool = True

    @property
    def kv_heads(self):
        return self.Hkv or self.H

    @property
    def v_dim(self):
        return self.Dv or self.D

    def describe(self):
        """The harness's header of a shape: 'B=1, H=32/8, Nq=1000, Nk=8192, D=192/128, bf16, causal'."""
        heads = f"{self.H}" if self.kv_heads == self.H else f"{self.H}/{self.kv_heads}"
        n = f"N={self.Nq}" if self.Nq == self.Nk else f"Nq={self.Nq}, Nk={self.Nk}"
        dims = f"{self.D}" if self.v_dim == self.D else f"{self.D}/{self.v_dim}"
        return f"B={self.B}, H={heads}, {n}, D={dims}, {self.dtype}" + (", causal" if self.causal else "")


INT_OPTIONS = {"--B": "B", "--H": "H", "--Hkv": "Hkv", "--Nq": "Nq", "--Nk": "Nk", "--D": "D", "--Dv": "Dv"}


def parse_shape(text):
    """The harness's shape options (see the module's text) -> Shape; anything else a one-line BadInput."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise BadInput(f"shape '{text}': {e}") from None
    fields, i = {}, 0
    while i < len(words):
        word = words[i]
        if word in ("--causal", "--no-check"):
            fields["causal" if word == "--causal" else "check"] = word == "--causal"
            i += 1
            continue
        if word not in INT_OPTIONS and word not in ("--N", "--dtype"):
            raise BadInput(f"shape '{text}': unknown option '{word}' (the harness's --B --H --Hkv --N --Nq --Nk "
                           "--D --Dv --dtype --causal --no-check)")
        if i + 1 >= len(words):
            raise BadInput(f"shape '{text}': {word} needs a value")
        value = words[i + 1]
        if word == "--dtype":
            if value not in DTYPES:
                raise BadInput(f"shape '{text}': --dtype is fp16 or bf16, got '{value}'")
            fields["dtype"] = value
        else:
            if not value.isdigit() or int(value) < 1:
                raise BadInput(f"shape '{text}': {word} needs a positive integer, got '{value}'")
            for name in (("Nq", "Nk") if word == "--N" else (INT_OPTIONS[word],)):
                fields[name] = int(value)
        i += 2
    shape = replace(Shape(), **fields)
    if shape.H % shape.kv_heads:
        raise BadInput(f"shape '{text}': --H {shape.H} is not a multiple of --Hkv {shape.kv_heads}")
    return shape


def pairs(nq, nk, causal):
    """The (query, key) pairs of one head that the mask keeps; causal: bottom-right aligned."""
    if not causal:
        return nq * nk
    return sum(min(max(i + nk - nq + 1, 0), nk) for i in range(nq))


def forward_flops(shape):
    """2·B·H·(D + Dv)·pairs: the harness's forward FLOPs."""
    return 2 * shape.B * shape.H * (shape.D + shape.v_dim) * pairs(shape.Nq, shape.Nk, shape.causal)


def backward_flops(shape):
    """2·B·H·(3D + 2Dv)·pairs: the harness's backward FLOPs."""
    return 2 * shape.B * shape.H * (3 * shape.D + 2 * shape.v_dim) * pairs(shape.Nq, shape.Nk, shape.causal)


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def verdict(checks, lse_err=None):
    """(status, err, tol, text) of a row from its checked outputs [(name, err, tol)]: PASS when every
    err <= tol (nothing NaN) and the LSE, when given, within LSE_TOL; err and tol those of the output
    nearest its bound (the harness's max_err and tol columns)."""
    lse_failed = lse_err is not None and not lse_err <= LSE_TOL
    failed = [n for n, e, t in checks if not e <= t] + (["lse"] if lse_failed else [])
    name, err, tol = max(checks, key=lambda c: math.inf if not c[1] <= c[2] else c[1] / max(c[2], 1e-30))
    status = "FAIL" if failed else "PASS"
    parts = [f"{n if len(checks) > 1 else 'err'} {e:.2e} {'<=' if e <= t else '>'} {t:.2e}" for n, e, t in checks]
    if lse_err is not None:  # the harness's form: the bound shown only where it is broken
        parts.append(f"lse {lse_err:.2e}" + (f" > {LSE_TOL:.2e}" if lse_failed else ""))
    return status, err, tol, f"{status} " + ", ".join(parts)


def note(shape, text, software):
    """A row's note: 'Hkv=N; ' for GQA (results_csv reads it into the shape key), the text, the software line."""
    head = f"Hkv={shape.kv_heads}; " if shape.kv_heads != shape.H else ""
    return head + "; ".join(part for part in (text, software) if part)


def csv_row(fields, shape, variant, seed, status, ms=None, flops=None, err=None, tol=None, lse_err=None, text=""):
    """One row of the harness's columns (results_csv.COLUMNS): `fields` the run's gpu..date columns."""
    ran = ms is not None
    return {**fields, "variant": variant, "kind": rc.PEER, "B": shape.B, "H": shape.H, "Nq": shape.Nq,
            "Nk": shape.Nk, "D": shape.D, "Dv": shape.v_dim, "dtype": shape.dtype, "causal": int(shape.causal),
            "time_ms": f"{ms:.6f}" if ran else "", "tflops": f"{tflops(flops, ms):.2f}" if ran else "",
            "ratio_to_best_peer": "", "status": status, "max_err": "" if err is None else f"{err:.3e}",
            "tol": "" if tol is None else f"{tol:.3e}", "lse_err": "" if lse_err is None else f"{lse_err:.3e}",
            "seed": seed, "note": text}


def csv_line(row):
    return ",".join(run_info.csv_text(row[c]) for c in rc.COLUMNS)


def check_csv(path):
    """None when rows can be appended to `path` (absent, empty or the harness's header), else why not."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path, encoding="utf-8") as f:
        if f.readline().rstrip("\r\n") != ",".join(rc.COLUMNS):
            return f"{path} has other columns than the harness's results CSV: use another file"
    return None


def append_rows(path, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write(",".join(rc.COLUMNS) + "\n")
        for row in rows:
            f.write(csv_line(row) + "\n")


def fa4_installed():
    """Whether flash_attn.cute (flash-attn-4) can be found, without importing torch or the DSL."""
    import importlib.util
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except (ImportError, ValueError):
        return False


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"bench_peers.py: {message}\n")
        sys.exit(2)


def parse_args(argv):
    ap = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", action="append", default=None,
                    help=f"one shape in the harness's options, repeatable (default: '{DEFAULT_SHAPE}')")
    ap.add_argument("--bwd", action="store_true", help="the backward rows (fa4 bwd) instead of the forward's")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="shape k's inputs from seed + k")
    ap.add_argument("--no-check", action="store_true", help="timing only")
    ap.add_argument("--csv", default=None, help="default: results/<gpu>/bench.csv (--bwd: bwd.csv)")
    ap.add_argument("--no-csv", action="store_true")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds after which no further shape starts (0: no limit); those left are listed")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.iters < 1:
        ap.error("--warmup must be >= 0 and --iters >= 1")
    args.shapes = [parse_shape(s) for s in (args.shape or [DEFAULT_SHAPE])]
    return args


def main(argv=None):
    try:
        args = parse_args(argv)
    except BadInput as e:
        print(f"bench_peers.py: {e}", file=sys.stderr)
        return 2
    if not fa4_installed():
        print(f"fa4: not installed ({INSTALL})")
        return 0
    try:
        import torch
    except ImportError:
        print(f"fa4: torch is not installed, so neither is a usable flash-attn-4 ({INSTALL})")
        return 0
    if not torch.cuda.is_available():
        print("bench_peers.py: no usable GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 3
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # a wheel without its DSL libraries, a DSL without its CUDA: absent all the same
        print(f"fa4: flash_attn.cute does not import: {run_info.first_line(e)} ({INSTALL})")
        return 0
    return Bench(args, torch, flash_attn_func).run()


class Bench:
    """The GPU side: inputs, FlashAttention-4's calls, the references, the timer, the rows."""

    def __init__(self, args, torch, fa4_func):
        import inspect

        from gpu_timing import Timer

        self.args, self.torch, self.fa4_func = args, torch, fa4_func
        self.fa4_returns_lse = "return_lse" in inspect.signature(fa4_func).parameters
        self.device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference in fp32, not TF32
        self.timer = Timer(torch, self.device)
        self.gpu = torch.cuda.get_device_name()
        self.versions = run_info.software(torch)
        self.software = run_info.software_line(self.versions)
        self.fields = run_info.system_fields(self.gpu, self.versions)
        self.first_calls = 0.0
        default = os.path.join(ROOT, "results", run_info.gpu_slug(self.gpu), "bwd.csv" if args.bwd else "bench.csv")
        self.path = None if args.no_csv else args.csv or default

    # ---- inputs and calls ----------------------------------------------------------------------
    def inputs(self, shape, seed):
        """q [B, Nq, H, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv] (FlashAttention-4's layout), dO [B, Nq, H, Dv]."""
        torch = self.torch
        dtype = torch.float16 if shape.dtype == "fp16" else torch.bfloat16
        g = torch.Generator(device=self.device).manual_seed(seed)

        def normal(*size):
            return torch.randn(*size, generator=g, device=self.device, dtype=dtype)

        return (normal(shape.B, shape.Nq, shape.H, shape.D), normal(shape.B, shape.Nk, shape.kv_heads, shape.D),
                normal(shape.B, shape.Nk, shape.kv_heads, shape.v_dim), normal(shape.B, shape.Nq, shape.H, shape.v_dim))

    def fa4(self, q, k, v, shape, lse=False):
        """FlashAttention-4's forward: (out, lse or None)."""
        extra = {"return_lse": True} if lse and self.fa4_returns_lse else {}
        r = self.fa4_func(q, k, v, softmax_scale=1.0 / math.sqrt(shape.D), causal=shape.causal, **extra)
        return (r[0], r[1]) if isinstance(r, tuple) else (r, None)

    def cudnn(self, q, k, v, shape):
        """sdpa(cudnn) on [B, H, N, D] tensors, the same-process yardstick of the timing."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return self.torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=shape.causal, scale=1.0 / math.sqrt(shape.D),
                enable_gqa=shape.kv_heads != shape.H)

    # ---- the reference -------------------------------------------------------------------------
    def unfused(self, q, k, v, shape, grad_out=None):
        """softmax(q·kᵀ·scale)·v in q's dtype, per batch and KV head (a group of query heads at a time:
        S of one group fits where S of all heads would not): O [B, Nq, H, Dv] (rows that see no key: 0) and
        the LSE [B, H, Nq]; with grad_out (dO, same layout as O) instead (dQ, dK, dV) through autograd."""
        torch = self.torch
        group = shape.H // shape.kv_heads
        scale = 1.0 / math.sqrt(shape.D)
        keep = None
        if shape.causal:  # bottom-right: query i sees key j iff j <= i + Nk - Nq
            i = torch.arange(shape.Nq, device=self.device)[:, None]
            keep = torch.arange(shape.Nk, device=self.device)[None, :] <= i + shape.Nk - shape.Nq
        outs = [torch.empty_like(t) for t in (q, k, v)] if grad_out is not None else None
        o = q.new_empty(shape.B, shape.Nq, shape.H, shape.v_dim) if grad_out is None else None
        lse = torch.empty(shape.B, shape.H, shape.Nq, device=self.device) if grad_out is None else None
        for b in range(shape.B):
            for g in range(shape.kv_heads):
                heads = slice(g * group, (g + 1) * group)
                qg = q[b, :, heads].transpose(0, 1)  # [group, Nq, D]
                kg, vg = k[b, :, g], v[b, :, g]      # [Nk, D], [Nk, Dv]
                if grad_out is not None:
                    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (qg, kg, vg))
                with torch.set_grad_enabled(grad_out is not None):
                    s = (qg @ kg.transpose(0, 1)) * scale  # [group, Nq, Nk]
                    if keep is not None:
                        s = s.masked_fill(~keep, -math.inf)
                    og = (torch.softmax(s, -1) @ vg).nan_to_num(0.0)  # [group, Nq, Dv]
                if grad_out is None:
                    o[b, :, heads] = og.transpose(0, 1)
                    lse[b, heads] = torch.logsumexp(s.float(), -1)
                    continue
                dq, dk, dv = torch.autograd.grad(og, (qg, kg, vg), grad_out[b, :, heads].transpose(0, 1))
                outs[0][b, :, heads] = dq.transpose(0, 1)
                outs[1][b, :, g], outs[2][b, :, g] = dk, dv
                del s, og
        return (o, lse) if grad_out is None else outs

    def rounding_floor(self, ref, dtype):
        """2 x the largest rounding error to `dtype` of ref's finite entries, at their size + 0.3: FlashAttention's
        form, tests/python/flex_reference.py's rounding_floor (which needs the attnlab module; this script does
        not)."""
        finite = ref[self.torch.isfinite(ref)].double()
        if finite.numel() == 0:
            return 0.0
        return 2 * ((finite + 0.3).to(dtype).double() - 0.3 - finite).abs().max().item()

    def rule(self, got, ref, low):
        """(err, tol) of one output: max|got - ref|, 2·max|low - ref| + the rounding floor; err NaN if got has one."""
        torch = self.torch
        if torch.isnan(got).any():
            return math.nan, 0.0
        err = (got.float() - ref).abs().max().item()
        return err, 2 * (low.float() - ref).abs().max().item() + self.rounding_floor(ref, got.dtype)

    # ---- one shape -----------------------------------------------------------------------------
    def row(self, shape, seed, status, text="", **values):
        return csv_row(self.fields, shape, FA4_BWD if self.args.bwd else FA4, seed, status,
                       text=note(shape, text, self.software), **values)

    def shape_rows(self, shape, seed):
        """The rows of one shape: fa4 (or fa4 bwd) and its printed lines."""
        torch = self.torch
        name = FA4_BWD if self.args.bwd else FA4
        q, k, v, dout = self.inputs(shape, seed)

        def graph():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            return self.fa4(*leaves, shape)[0], leaves

        # The first calls compile FlashAttention-4's kernels for this shape's configuration, the timed call's
        # first (forward: then the check's, which asks for the LSE too): untimed.
        start = time.perf_counter()
        try:
            if self.args.bwd:
                out, leaves = graph()
                grads = torch.autograd.grad(out, leaves, dout)
                lse = None
            else:
                self.fa4(q, k, v, shape)
                out, lse = self.fa4(q, k, v, shape, lse=True)
                grads = None
            torch.cuda.synchronize()
        except Exception as e:  # FlashAttention-4's refusal of the shape (an assertion) or a failure
            reason = run_info.first_line(e) or type(e).__name__
            print(f"{name:>16}: unsupported: {reason}")
            return [self.row(shape, seed, "unsupported", reason)]
        first = time.perf_counter() - start
        self.first_calls += first
        if first > 1.0:
            print(f"{'':>16}  first call {first:.1f} s (FlashAttention-4's JIT compile; outside the timing)")

        check, status, err, tol, lse_err = "", "unchecked", None, None, None
        if shape.check and not self.args.no_check:
            try:
                status, err, tol, lse_err, check = self.check(shape, q, k, v, dout, out, lse, grads)
            except Exception as e:  # the reference's failure (memory): the row is timed, not judged
                check = f"unchecked (the reference failed: {run_info.first_line(e, 100)})"
                print(f"{name:>16}  {check}")
        del out
        if self.args.bwd:
            del grads

        # The timing: fa4 and, where cuDNN runs the shape, sdpa(cudnn) on [B, H, N, D] copies.
        flops = backward_flops(shape) if self.args.bwd else forward_flops(shape)
        calls = [self.backward_call(graph) if self.args.bwd else (lambda: self.fa4(q, k, v, shape))]
        yardstick = self.yardstick(q, k, v, shape)
        if yardstick:
            calls.append(yardstick)
        (ms, *ms_cudnn), errors = self.timer.time_interleaved(calls, self.args.warmup, self.args.iters)
        if errors[0]:
            print(f"{name:>16}: error: {errors[0]}")
            return [self.row(shape, seed, "error", errors[0])]
        ratio = ""
        if ms_cudnn and ms_cudnn[0]:
            ratio = (f"{YARDSTICK}{' bwd' if self.args.bwd else ''} in this process "
                     f"{tflops(flops, ms_cudnn[0]):.2f} TFLOPS: {name} {ms_cudnn[0] / ms:.2f}x")
        text = "; ".join(t for t in (check or status, ratio) if t)
        print(f"{name:>16}: time:{ms:.6f}ms, TFLOPS:{tflops(flops, ms):<8.2f} {text}")
        return [self.row(shape, seed, status, text, ms=ms, flops=flops, err=err, tol=tol, lse_err=lse_err)]

    def check(self, shape, q, k, v, dout, out, lse, grads):
        """verdict()'s (status, err, tol) and the LSE error (forward) against the fp32 reference, and the text."""
        torch = self.torch
        if self.args.bwd:
            ref = self.unfused(q.float(), k.float(), v.float(), shape, dout.float())
            low = self.unfused(q, k, v, shape, dout)
            checks = [(n, *self.rule(g, r, lo)) for n, g, r, lo in zip(("dQ", "dK", "dV"), grads, ref, low)]
            lse_err = None
        else:
            ref, ref_lse = self.unfused(q.float(), k.float(), v.float(), shape)
            low, _ = self.unfused(q, k, v, shape)
            checks = [("O", *self.rule(out, ref, low))]
            lse_err = None
            if lse is not None and lse.shape == ref_lse.shape:
                finite = torch.isfinite(ref_lse)
                lse_err = (lse.float() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
        status, err, tol, text = verdict(checks, lse_err)
        return status, err, tol, lse_err, text

    def yardstick(self, q, k, v, shape):
        """sdpa(cudnn)'s call on [B, H, N, D] copies (its backward's with --bwd), or None where cuDNN does
        not run the shape (torch's is_causal is top-left aligned when Nq != Nk)."""
        torch = self.torch
        if shape.causal and shape.Nq != shape.Nk:
            return None
        qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))

        def graph():
            leaves = [t.detach().requires_grad_() for t in (qh, kh, vh)]
            return self.cudnn(*leaves, shape), leaves

        try:  # a trial: cuDNN's refusal leaves the timing to fa4 alone
            if self.args.bwd:
                out, leaves = graph()
                torch.autograd.grad(out, leaves, torch.randn_like(out))
            else:
                self.cudnn(qh, kh, vh, shape)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{'':>16}  ({YARDSTICK} does not run this shape: {run_info.first_line(e, 100)})")
            return None
        return self.backward_call(graph) if self.args.bwd else (lambda: self.cudnn(qh, kh, vh, shape))

    def backward_call(self, graph):
        """A timed backward: (prepare, timed) for the timer. prepare builds the forward graph (graph() ->
        (out, leaves)) and a fresh random dO, untimed; timed is the backward alone."""
        torch = self.torch

        def prepare():
            out, leaves = graph()
            return out, leaves, torch.randn_like(out)

        return prepare, lambda g: torch.autograd.grad(g[0], g[1], g[2])

    # ---- the run -------------------------------------------------------------------------------
    def run(self):
        args = self.args
        if self.path and (why := check_csv(self.path)):
            print(f"bench_peers.py: {why}", file=sys.stderr)
            return 2
        print(f"FlashAttention-4 ({'backward' if args.bwd else 'forward'}) on {self.gpu}; software: {self.software}")
        started, rows, left = time.perf_counter(), [], []
        for n, shape in enumerate(args.shapes):
            if args.budget and time.perf_counter() - started > args.budget:
                left.append(shape)
                continue
            seed = args.seed + n
            print(f"---- {'backward: ' if args.bwd else ''}{shape.describe()}, Warmup: {args.warmup}, "
                  f"Iters: {args.iters}, Seed: {seed}{'' if shape.check and not args.no_check else ', unchecked'}")
            new = self.shape_rows(shape, seed)
            if self.path:
                append_rows(self.path, new)  # shape by shape: a run cut short keeps what it measured
            rows += new
            self.torch.cuda.empty_cache()
        for shape in left:
            print(f"not run (past --budget {args.budget:g} s): {shape.describe()}")
        print(f"{len(rows)} rows{' -> ' + os.path.relpath(self.path, ROOT) if self.path else ''}; first calls "
              f"(FlashAttention-4's JIT compile) {self.first_calls:.1f} s in all, outside the timing")
        return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
