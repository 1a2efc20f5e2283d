#!/usr/bin/env python3
"""Fuzz tester of attnlab.flex_attention, forward and backward, against torch's
flex_attention in eager mode (scripts/gpu_check.sh runs it; its report is
results/<gpu>/blocksparse_fuzz.txt).

    PYTHONPATH=build/python python3 scripts/fuzz_blocksparse.py                  # curated + 200 random cases
    PYTHONPATH=build/python python3 scripts/fuzz_blocksparse.py --quick          # the curated list only
    PYTHONPATH=build/python python3 scripts/fuzz_blocksparse.py --seed 7 --cases 1000 --out /tmp/fuzz.txt
    PYTHONPATH=build/python python3 scripts/fuzz_blocksparse.py --only document  # the cases whose name holds TEXT

Each case runs the forward and, where the backward takes its head dims, the
backward for a fresh normal upstream gradient dO. O, LSE, dQ, dK and dV are
each held to the rule of tests/python/flex_reference.py: torch's eager
flex_attention on float64 copies is the reference, the same call in the
inputs' dtype the yardstick, ours within 2 x the yardstick's error + a floor
of roundings (that file says which, and why not an fp32 reference);
nothing NaN or +inf, -inf exactly where the reference's LSE has it. Rows that
see no key must hold O = 0 and dQ = 0 exactly, keys that no query sees
dK = dV = 0. A case marked `det` runs its backward 5 times under
torch.use_deterministic_algorithms(True): the gradients must be bitwise
identical.

Cases: the curated list (every mask_mod and score_mod of mods.h over the
ragged lengths 1, 17, 113x203, 239x1, 799x3; causal with Nq != Nk; 4224 and
128x8192 at B = H = 1; GQA and MQA; D = 64, 128, 192/128, 256, and 128/64,
which only the forward takes; blocks 128x128 and 256x256), the curated cases
of the tensor mods, and --cases random ones from --seed (B*H <= 8, lengths
<= 2048, a quarter of them det). Each case's inputs follow from --seed and its
place in the list alone, so that --only reruns a case on the same numbers;
the tensor-mod cases have places of their own (negative), so that the random
cases keep the places, and the numbers, they had before those cases.

Tensor mods: a keep tensor as the mask_mod (attnlab.create_block_mask(keep,
...), random over blocks that are empty, full, or about half kept; or each
row's top k) and a bias tensor as the score_mod (score_mod=bias, broadcast
or not), drawn from a generator of their own. Their reference is torch's
eager flex_attention with the closures a user writes over the tensors,
mask_mod keep_full[b, h, q, kv] and score_mod s + bias_full[b, h, q, kv]
(each expanded to [B, H, Q_LEN, KV_LEN]), in float64 and in the inputs'
dtype as above; dBias, the bias's gradient, is held to the rule on its own
like dQ, dK and dV (torch's eager backward returns a captured tensor's
gradient), and must be 0 where no kept pair reads the bias.

One line per case: PASS, FAIL or SKIP(reason), the case's name, then each
output's max error against its bound (err<=bound), then what failed. SKIP:
the forward passed and the backward refused the case for a documented reason
(the head dims it does not take); a refusal for any other reason, and any
other exception, is a FAIL. The report ends with one line `N passed, M
failed` (a skipped case is neither); the exit status is 0 iff M = 0.
"""
import argparse
import os
import random
import re
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

try:
    import torch
    from torch.nn.attention import flex_attention as torch_flex_module

    import attnlab
    import flex_reference as fr
    from flex_reference import Case, TensorCase
except ImportError as error:
    sys.exit(f"fuzz_blocksparse.py: {error} (needs torch with CUDA and attnlab: PYTHONPATH=build/python, or pip "
             "install --no-build-isolation .)")

DET_RUNS = 5
# torch's flex_attention without torch.compile warns that it materialises the
# scores: its eager path is the reference here, on purpose.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
# The refusals of the backward that docs/blocksparse.md and flex_attention's
# docstring name: head dims without a backward tile. The reason is the text
# after "does not support <shape>: ".
DOCUMENTED_REFUSALS = ("head dims ",)
fp16, bf16 = torch.float16, torch.bfloat16


# ---- the cases --------------------------------------------------------------------------
def curated():
    shapes = [(1, 1), (17, 17), (113, 203), (239, 1), (799, 3)]
    cases = []
    for n, mask in enumerate(fr.MASKS):  # every mask_mod over the ragged lengths, the score_mods in turn
        for m, (Nq, Nk) in enumerate(shapes):
            cases.append(Case(mask, fr.SCORES[(n + m) % len(fr.SCORES)], Nq, Nk, dtype=(bf16, fp16)[(n + m) % 2]))
    for score in fr.SCORES:  # every score_mod with partial and full blocks, in both dtypes
        for dtype in (bf16, fp16):
            cases.append(Case("prefix_lm:150", score, 333, 455, dtype=dtype))
    cases += [
        # causal with Nq != Nk; query blocks that see no key, key blocks that no query sees
        Case("causal", None, 1000, 300), Case("causal", "alibi", 300, 1000, dtype=fp16),
        Case("causal", "rel_bias", 1000, 300, deterministic=True),
        Case("sliding_window:64,32", None, 520, 130), Case("sliding_window:64,32", "softcap:2", 130, 520),
        # long sequences, one head
        Case("causal", None, 4224, 4224, H=1, deterministic=True), Case("document", "alibi", 4224, 4224, H=1),
        Case("causal", None, 128, 8192, H=1), Case("sliding_window:1024,0", "rel_bias", 128, 8192, H=1, dtype=fp16),
        # GQA and MQA
        Case("causal", None, 700, 900, H=4, Hkv=2, deterministic=True),
        Case("document", "softcap:30", 513, 513, B=2, H=4, Hkv=1, deterministic=True),
        Case("none", "alibi", 1000, 1000, B=1, H=8, Hkv=1, dtype=fp16),
        # head dims
        Case("causal", "alibi", 257, 513, D=64), Case("mini_causal:64", "softcap:2", 1000, 1000, D=64, dtype=fp16),
        Case("causal", None, 700, 700, D=192, Dv=128, deterministic=True),
        Case("document", "softcap:30", 600, 600, B=2, D=192, Dv=128),
        Case("sliding_window:64,32", "softcap:2", 300, 1000, D=256), Case("none", "rel_bias", 300, 700, Dv=64),
        # blocks of 256 x 256
        Case("causal", "alibi", 799, 799, block=(256, 256), deterministic=True),
        Case("prefix_lm:150", None, 700, 900, block=(256, 256), dtype=fp16),
        Case("mini_causal:64", "rel_bias", 1000, 1000, block=(256, 256), H=4, Hkv=1),
        Case("document", None, 1024, 1024, B=2, block=(256, 256), D=64, deterministic=True),
        Case("dilated_sliding_window:256,2", None, 900, 900, block=(256, 256), D=192, Dv=128),
        # a scale of the caller's
        Case("causal", "softcap:30", 500, 600, scale=0.3),
    ]
    return cases


def random_cases(count, seed):
    rng = random.Random(seed)
    # (64, 64), (128, 128), (192, 128) twice as often as (256, 256) and (128, 64).
    dims = [(64, 64), (128, 128), (192, 128)] * 2 + [(256, 256), (128, 64)]
    heads = [(1, 1, 1), (1, 2, 2), (2, 2, 2), (1, 4, 2), (1, 4, 1), (2, 4, 1), (2, 3, 1), (1, 8, 2), (4, 2, 2),
             (1, 8, 8), (2, 4, 4)]  # (B, H, Hkv), B*H <= 8
    blocks = [(128, 128), (256, 256), (128, 256), (256, 128), (384, 384)]

    def length():
        return rng.randint(1, 64) if rng.random() < 0.2 else rng.randint(1, 2048)

    cases = []
    for _ in range(count):
        mask, score = rng.choice(fr.MASK_DRAWS)(rng), rng.choice(fr.SCORE_DRAWS)(rng)
        D, Dv = rng.choice(dims)
        B, H, Hkv = rng.choice(heads)
        Nq = length()
        Nk = Nq if rng.random() < 0.3 else length()
        scale = round(rng.uniform(0.02, 0.3), 3) if rng.random() < 0.2 else None
        cases.append(Case(mask, score, Nq, Nk, B=B, H=H, Hkv=Hkv, D=D, Dv=Dv, dtype=rng.choice([bf16, fp16]),
                          block=rng.choice(blocks), scale=scale, deterministic=rng.random() < 0.25))
    return cases


# ---- the tensor mods --------------------------------------------------------------------
def tensor_cases():
    """The curated cases of the tensor mods: keep masks random over blocks
    (each empty, full or about half kept), each row's top k, or with rows and
    keys dropped whole ("holes"); a bias of each broadcast shape, alone, with
    a spec mask_mod and with a keep mask; ragged lengths, GQA and MQA, D =
    64, 128 and 256."""
    T = TensorCase
    return [
        T(keep="blocks", Nq=1000, Nk=1000, B=2),
        T(keep="blocks", keep_shape="11QK", keep_as="packed", Nq=700, Nk=900, dtype=fp16, deterministic=True),
        T(keep="topk", Nq=513, Nk=1024, H=4, Hkv=2),
        T(keep="topk", keep_shape="B1QK", keep_as="uint8", Nq=300, Nk=1000, B=2, dtype=fp16),
        T(keep="blocks", keep_shape="1H1K", Nq=1000, Nk=300, H=4, Hkv=1),
        T(keep="holes", bias="BHQK", Nq=333, Nk=455, dtype=fp16),  # rows that see no key, keys no query sees
        T(bias="QK", Nq=1000, Nk=1000),
        T(bias="1H1K", mask="causal", Nq=300, Nk=1000, H=4, Hkv=2, dtype=fp16, deterministic=True),
        T(bias="B1QK", mask="sliding_window:64,32", Nq=520, Nk=130, B=2),
        T(bias="BHQK", Nq=17, Nk=17, dtype=fp16),
        T(keep="blocks", keep_shape="11QK", bias="1H1K", Nq=1000, Nk=1000, D=64, deterministic=True),
        T(bias="11QK", mask="prefix_lm:150", Nq=455, Nk=333, D=256, dtype=fp16),
        T(keep="topk", keep_shape="B1QK", bias="B1QK", Nq=113, Nk=203, B=2, block=(256, 256)),
    ]


def tensor_mods(c, seed):
    """(keep, mask_mod, bias) of case c from a torch.Generator seeded with
    `seed` (not torch's global one, which draws the inputs): keep the bool
    mask (the spec's pairs where c.keep is None), mask_mod what
    create_block_mask gets, bias standard normal in the inputs' dtype or None."""
    gen = torch.Generator(device=fr.DEVICE).manual_seed(seed)
    if c.keep:
        keep = fr.keep_mask(c.keep, c.shape(c.keep_shape), c.block, gen)
        mask_mod = {"bool": lambda: keep, "packed": lambda: attnlab.pack_mask(keep),
                    "uint8": lambda: keep.to(torch.uint8) * 3}[c.keep_as]()
    else:
        keep, mask_mod = fr.spec_keep(c.mask, c.Nq, c.Nk), c.mask  # none of these specs reads b or h
    bias = None
    if c.bias is not None:
        bias = torch.randn(c.shape(c.bias), device=fr.DEVICE, generator=gen).to(c.dtype)
    return keep.expand(c.B, c.H, c.Nq, c.Nk), mask_mod, bias


def tensor_reference(c, q, k, v, keep, bias, dout):
    """(ref, low), each (out, lse, dq, dk, dv[, dbias]) of torch's eager
    flex_attention with the closures over the tensors, keep_full[b, h, q, kv]
    and s + bias_full[b, h, q, kv] (keep and the bias expanded to [B, H,
    Q_LEN, KV_LEN]), on float64 copies (ref) and in the inputs' dtype (low).
    The bias's gradient is the captured tensor's, which torch's eager
    backward computes (its dense backward's captured-buffer gradients, torch
    >= 2.6), summed through the expand into the bias's own shape."""
    full = (c.B, c.H, c.Nq, c.Nk)
    block_mask = torch_flex_module.create_block_mask(lambda b, h, q_idx, kv_idx: keep[b, h, q_idx, kv_idx], c.B, c.H,
                                                     c.Nq, c.Nk, device=fr.DEVICE, BLOCK_SIZE=c.block)

    def outputs(dtype):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v, bias) if t is not None]
        bias_full = None if bias is None else leaves[3].expand(full)
        score_mod = None if bias is None else lambda s, b, h, q_idx, kv_idx: s + bias_full[b, h, q_idx, kv_idx]
        out, lse = fr.flex_with_lse(*leaves[:3], score_mod, block_mask, c.scale, c.gqa)
        grads = torch.autograd.grad(out, leaves, dout.to(dtype))
        return (out.detach(), lse.detach(), *grads)

    return outputs(fr.REFERENCE_DTYPE), outputs(c.dtype)


def tensor_check(c, ours, q, k, v, keep, bias, dout):
    """fr.check for a TensorCase, dBias held to the rule on its own: ([(output,
    err, bound)], problems)."""
    ref, low = tensor_reference(c, q, k, v, keep, bias, dout)
    scale = c.D ** -0.5 if c.scale is None else c.scale
    floors = fr.tensor_floors(q, k, v, ref[0], dout, keep, bias, scale)
    results, problems = fr.judge_outputs(ours, ref, low, floors)
    return results, problems + fr.unreached(c, keep, ours, () if bias is None else bias.shape)


# ---- one case ---------------------------------------------------------------------------
class Deterministic:
    """torch.use_deterministic_algorithms(on) inside, the caller's setting after."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.previous = (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled())
        if self.on:
            torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.previous[0], warn_only=self.previous[1])


def attnlab_forward(c, block_mask, q, k, v, bias=None):
    """(out, lse, leaves) of attnlab.flex_attention on fresh leaves copied from
    q, k, v, and from the bias where the score_mod is that tensor."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, bias) if t is not None]
    score_mod = c.score if bias is None else leaves[3]
    out, lse = attnlab.flex_attention(*leaves[:3], block_mask=block_mask, score_mod=score_mod, scale=c.scale,
                                      enable_gqa=c.gqa, return_lse=True)
    torch.cuda.synchronize()  # a kernel's error belongs to this case
    return out, lse, leaves


def attnlab_backward(out, leaves, dout):
    """(dq, dk, dv[, dbias]) of out for the upstream gradient dout."""
    grads = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    return grads


def documented_refusal(c, error):
    """The reason of a backward's ValueError when it is a documented refusal of
    head dims that the backward does not take, else None."""
    match = re.search(r"does not support [^:]*: (.*)", str(error))
    if (c.D, c.Dv) in fr.BWD_HEAD_DIMS or not match or not match.group(1).startswith(DOCUMENTED_REFUSALS):
        return None
    return match.group(1)


def run_case(c, seeds):
    """(status, fields): status PASS, FAIL or SKIP(reason); fields each
    output's error against its bound, and what failed."""
    q, k, v, doc_ids = fr.make_inputs(c, seeds)
    dout = fr.upstream_gradient(c)
    keep, bias = None, None
    if isinstance(c, TensorCase):
        keep, mask_mod, bias = tensor_mods(c, next(seeds))
        block_mask = attnlab.create_block_mask(mask_mod, c.B, c.H, c.Nq, c.Nk, BLOCK_SIZE=c.block)
    else:
        block_mask = attnlab.create_block_mask(c.mask, c.B if doc_ids is not None else None, None, c.Nq, c.Nk,
                                               BLOCK_SIZE=c.block, doc_ids=doc_ids)
    skip, runs = None, []
    with Deterministic(c.deterministic):
        out, lse, leaves = attnlab_forward(c, block_mask, q, k, v, bias)
        try:
            runs.append(attnlab_backward(out, leaves, dout))
        except ValueError as error:
            skip = documented_refusal(c, error)
            if skip is None:
                raise
        for _ in range(DET_RUNS - 1 if runs and c.deterministic else 0):  # forward and backward again
            again, _, again_leaves = attnlab_forward(c, block_mask, q, k, v, bias)
            runs.append(attnlab_backward(again, again_leaves, dout))
    ours = (out.detach(), lse, *(runs[0] if runs else ()))
    if keep is None:
        results, problems = fr.check(c, ours, q, k, v, doc_ids, dout)
    else:
        results, problems = tensor_check(c, ours, q, k, v, keep, bias, dout)
    fields = [f"{what} {err:.1e}{'<=' if err <= bound else '>'}{bound:.1e}" for what, err, bound in results]
    if c.deterministic and runs:
        differ = [f"{name} of run {n}" for n, again in enumerate(runs[1:], 2)
                  for name, first, other in zip(("dQ", "dK", "dV", "dBias"), runs[0], again)
                  if not torch.equal(first, other)]
        fields.append(f"det {'bitwise x' + str(len(runs)) if not differ else 'DIFFERS'}")
        if differ:
            problems.append(f"not bitwise repeatable: {', '.join(differ)} differ from run 1's")
    if problems:
        return "FAIL", fields + ["| " + "; ".join(problems)]
    return ("PASS" if skip is None else f"SKIP(backward: {skip})"), fields


# ---- the report -------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the curated list only")
    ap.add_argument("--seed", type=int, default=20260301, help="of the random cases and of every case's inputs")
    ap.add_argument("--cases", type=int, default=200, help="random cases (default 200)")
    ap.add_argument("--only", default=None, metavar="TEXT", help="run only the cases whose name holds TEXT")
    ap.add_argument("--out", default=None, metavar="FILE", help="also write the report to FILE")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fuzz_blocksparse.py: torch sees no CUDA GPU")

    # A case's inputs follow from its place (the seeds below). The tensor-mod
    # cases run after the other curated ones but take places of their own,
    # -1, -2, ..., so that the random cases keep theirs.
    spec_cases, tensor = curated(), tensor_cases()
    cases = spec_cases + tensor
    places = list(range(len(spec_cases))) + [-1 - j for j in range(len(tensor))]
    n_curated = len(cases)
    if not args.quick:
        cases += random_cases(args.cases, args.seed)
        places += range(len(spec_cases), len(spec_cases) + args.cases)
    out = open(args.out, "w", encoding="utf-8") if args.out else None

    def report(line):
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    report(f"attnlab.flex_attention against torch {torch.__version__} flex_attention (eager, reference in "
           f"{str(fr.REFERENCE_DTYPE)[6:]}) on "
           f"{torch.cuda.get_device_name()}; seed {args.seed}; {n_curated} curated + {len(cases) - n_curated} "
           "random cases" + (f", those holding '{args.only}'" if args.only else ""))
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    start = time.time()
    for i, c in zip(places, cases):
        name = repr(c)
        if args.only and args.only not in name:
            continue
        seeds = iter((args.seed * 100_003 + 2 * i, args.seed * 100_003 + 2 * i + 1))
        try:
            status, fields = run_case(c, seeds)
        except Exception as error:  # anything but a documented refusal is the case's failure
            text = (str(error).strip().splitlines() or [""])[0]
            status, fields = "FAIL", [f"| {type(error).__name__}: {text}"]
        counts[status[:4]] += 1
        report(f"{status} {name}  " + "  ".join(fields))
    print(f"fuzz_blocksparse.py: {sum(counts.values())} cases in {time.time() - start:.0f} s", file=sys.stderr)
    if counts["SKIP"]:
        report(f"{counts['SKIP']} skipped: the backward refuses their head dims (documented); their forward passed")
    report(f"{counts['PASS']} passed, {counts['FAIL']} failed")
    if out:
        out.close()
    return 0 if counts["FAIL"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
