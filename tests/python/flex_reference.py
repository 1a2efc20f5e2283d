"""The reference side of attnlab's block-sparse checks, shared by
tests/python/test_blocksparse.py and scripts/fuzz_blocksparse.py: torch's
flex_attention in eager mode as the reference, the pass rule, the case record
and its inputs; for the tensor mods (a keep mask as the mask_mod, a bias as
the score_mod) their case record, keep masks, floors and zero checks.

The rule (FlashAttention's tests/cute/test_mask_mod.py, the project's):
torch's flex_attention in eager mode on float64 copies of the inputs is the
reference, the same call in the inputs' dtype the yardstick; for each output
(O, the finite entries of LSE, dQ, dK, dV) on its own
    max|ours - ref| <= 2 * max|flex_same_precision - ref| + floor,
    floor = 2 * max|rnd(ref + 0.3) - 0.3 - ref|, rnd the rounding to the
            output's own dtype (q's for O, dQ, dK, dV; fp32 for LSE): the
            output's rounding, as FlashAttention's tests (whose reference is
            cast to the dtype) and the harness's output_rounding_error take it
          + for LSE, dQ and dK: 2 * u * the terms that cancel in them (below);
nothing is NaN or +inf, -inf (LSE of a row that sees no key) stands exactly
where the reference has it, rows that see no key hold O = 0 and dQ = 0 and
keys that no query sees dK = dV = 0, exactly. Gradients come from torch's
autograd on both sides, for the same upstream gradient dO.

flex's eager path computes in fp32 whatever the inputs' dtype; only its casts
(P before P @ V, dS before dS @ K) round to the dtype. So its LSE is off by
fp32 rounding alone, and so are its dQ and dK where dS = P(dP - Δ) cancels
(exactly in a row that sees one key: P = 1, O = V, dQ = 0). Ours, summing in
another order, is off by as much again, and twice one rounding noise bounds
no other. These three outputs therefore add one fp32 rounding (u = 2^-24) of
each term they are summed from, a bound on an fp32 sum's error:
scale·|q|·|k| over the kept pairs for LSE; for dQ (dK) the sums of
dQ = scale·dS @ K (dK = scale·dSᵀ @ Q) with |dS| replaced by
P·(|dO|·|V|ᵀ + rowsum|dO ∘ O|). For unit-normal inputs that is ~1e-6, well
below dQ's and dK's bound wherever they do not cancel. For the same reason
the reference is float64, not fp32: an fp32 one would round as the yardstick
does and share its noise. REFERENCE_DTYPE = torch.float32 gives the fp32 one.

Where torch's flex_attention refuses a shape (head dims that are not powers
of 2, in torch versions that do), the same computation written densely with
torch ops, the mask_mod and score_mod of attnlab.mods on index grids, stands
in for it in both precisions (P rounded to the dtype before P @ V, as flex's
eager path).
"""
import functools
import inspect
import math
import random

import torch
from torch.nn.attention import flex_attention as torch_flex_module

from attnlab import mods

DEVICE = "cuda"
REFERENCE_DTYPE = torch.float64
U32 = 2.0 ** -24  # fp32's unit roundoff
OUTPUTS = ("O", "LSE", "dQ", "dK", "dV")
# The head dims (D, Dv) that the block-sparse backward takes (docs/blocksparse.md);
# the forward also takes 128/64.
BWD_HEAD_DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))

# The curated specs: every example of attnlab.mods' rows (each mod of
# kernels/blocksparse/mods_table.h but the tensor ones); random specs: one
# entry per mod that draws a spec of it from a random.Random, so that a choice
# among them is uniform over the mods (attnlab.mods.spec_draws).
def _none_as_default(spec):
    """The score_mod none as None, flex_attention's default."""
    return None if spec == "none" else spec


MASKS = mods.example_specs(mods.MASK_ROWS)
SCORES = [_none_as_default(spec) for spec in mods.example_specs(mods.SCORE_ROWS)]
MASK_DRAWS = mods.spec_draws(mods.MASK_ROWS)
SCORE_DRAWS = [lambda rng, draw=draw: _none_as_default(draw(rng)) for draw in mods.spec_draws(mods.SCORE_ROWS)]


# ---- the references ---------------------------------------------------------------------
def mask_fn(spec, Nq, Nk, doc_ids):
    return mods.torch_mask_mod(spec, Nq, Nk, doc_ids)


# One callable per (spec, H): flex_attention runs through dynamo, which
# compiles again for a score_mod it has not seen (softcap's is made by eval,
# a new code object each time), and compiling dominates a small case's time.
score_fn = functools.lru_cache(maxsize=None)(mods.torch_score_mod)


def flex_with_lse(q, k, v, score_mod, block_mask, scale, enable_gqa):
    """(out, lse) of torch's flex_attention (eager), lse natural log."""
    params = inspect.signature(torch_flex_module.flex_attention).parameters
    if "return_aux" in params:  # newer torch: the LSE through AuxRequest
        out, aux = torch_flex_module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                                    enable_gqa=enable_gqa,
                                                    return_aux=torch_flex_module.AuxRequest(lse=True))
        return out, aux.lse
    return torch_flex_module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                            enable_gqa=enable_gqa, return_lse=True)


def torch_flex(q, k, v, mask_spec, score_spec, block_size, enable_gqa, doc_ids, scale=None):
    """(out, lse) of torch's flex_attention (eager) with the same mask_mod and
    score_mod written in Python, on q's dtype; lse natural log."""
    B, H, Nq, Nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    bm = torch_flex_module.create_block_mask(mask_fn(mask_spec, Nq, Nk, doc_ids), B if doc_ids is not None else None,
                                             None, Nq, Nk, device=q.device, BLOCK_SIZE=block_size)
    return flex_with_lse(q, k, v, score_fn(score_spec, H), bm, scale, enable_gqa)


def dense_probabilities(q, k, mask_spec, score_spec, doc_ids, scale=None):
    """(p, lse, keep) as flex_attention's eager path computes them: scores in
    fp32 (fp64 for fp64 inputs) from q @ k^T in q's dtype, the score_mod, the
    mask_mod (keep), the softmax; k has q's heads. A row without keys: p 0,
    lse -inf, and a gradient 0, not NaN (its scores are zeroed before the
    softmax and its probabilities after)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)).to(torch.promote_types(q.dtype, torch.float32)) * scale
    b = torch.arange(B, device=q.device)[:, None, None, None]
    h = torch.arange(H, device=q.device)[None, :, None, None]
    i = torch.arange(Nq, device=q.device)[None, None, :, None]
    j = torch.arange(Nk, device=q.device)[None, None, None, :]
    score = score_fn(score_spec, H)
    if score is not None:
        s = score(s, b, h, i, j)
    keep = torch.as_tensor(mask_fn(mask_spec, Nq, Nk, doc_ids)(b, h, i, j), device=q.device).expand(s.shape)
    empty = ~keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(~keep, 0.0)
    return p, torch.logsumexp(s, dim=-1), keep


def dense_flex(q, k, v, mask_spec, score_spec, enable_gqa, doc_ids, scale=None):
    """(out, lse) of dense_probabilities, P rounded to q's dtype before P @ V;
    differentiable."""
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    p, lse, _ = dense_probabilities(q, k, mask_spec, score_spec, doc_ids, scale)
    return p.to(q.dtype) @ v, lse


def tensor_probabilities(q, k, keep, bias, scale):
    """(p, lse, keep) of softmax(scale·q·kᵀ + bias) over the pairs `keep`
    keeps (the tensor mods: a keep mask, a bias), as dense_probabilities
    computes them: scores in fp32 (fp64 for fp64 inputs) from q·kᵀ in q's
    dtype; a row without keys p 0, lse -inf and a gradient 0, not NaN. k has
    q's heads; keep and bias broadcast to the scores."""
    s = (q @ k.transpose(-2, -1)).to(torch.promote_types(q.dtype, torch.float32)) * scale
    if bias is not None:
        s = s + bias
    keep = keep.expand(s.shape)
    empty = ~keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(~keep, 0.0)
    return p, torch.logsumexp(s.detach(), dim=-1), keep


def _outputs(flex, q, k, v, dout):
    """(out, lse) of flex(q, k, v), and with an upstream gradient dout also
    (dq, dk, dv) from torch's autograd on fresh leaves copied from q, k, v."""
    if dout is None:
        return flex(q, k, v)
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = flex(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.to(out.dtype))
    return out.detach(), lse.detach(), dq, dk, dv


def reference(q, k, v, mask_spec, score_spec, block_size, enable_gqa, doc_ids, scale=None, dout=None):
    """The outputs in REFERENCE_DTYPE (the reference) and in q's dtype (the
    yardstick), from torch's flex_attention or, where it refuses the shape,
    dense_flex: each (out, lse), or (out, lse, dq, dk, dv) with an upstream
    gradient dout."""
    wide = [t.to(REFERENCE_DTYPE) for t in (q, k, v)]

    def flex(q, k, v):
        return torch_flex(q, k, v, mask_spec, score_spec, block_size, enable_gqa, doc_ids, scale)

    def dense(q, k, v):
        return dense_flex(q, k, v, mask_spec, score_spec, enable_gqa, doc_ids, scale)

    try:
        return _outputs(flex, *wide, dout), _outputs(flex, q, k, v, dout)
    except (ValueError, NotImplementedError) as error:  # e.g. "NYI: ... non power of 2 embedding dimension"
        if "dimension" not in str(error) and "head" not in str(error):
            raise
    return _outputs(dense, *wide, dout), _outputs(dense, q, k, v, dout)


@torch.no_grad()
def cancellation_floors(q, k, v, out, dout, mask_spec, score_spec, doc_ids, scale=None):
    """{output: floor} for LSE and, with dout, dQ and dK: 2 u times the terms
    they are summed from (the module's docstring), in float64; out is the
    reference's O."""
    H, D, Hkv = q.shape[1], q.shape[3], k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    p, _, keep = dense_probabilities(q, k, mask_spec, score_spec, doc_ids, scale)
    dots = (q.abs() @ k.abs().transpose(-2, -1)).masked_fill(~keep, 0.0)
    floors = {"LSE": 2 * U32 * scale * dots.max().item()}
    if dout is not None:
        floors.update(_gradient_floors(p, q, k, v, out, dout, scale, Hkv)[0])
    return floors


def _gradient_floors(p, q, k, v, out, dout, scale, Hkv):
    """({"dQ": floor, "dK": floor}, ds): 2 u times the terms of dQ =
    scale·dS @ K and dK = scale·dSᵀ @ Q, |dS| replaced by its bound ds =
    P·(|dO|·|V|ᵀ + rowsum|dO ∘ O|); q, k, v float64, k and v repeated to
    q's heads from Hkv; out is the reference's O."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    dout = dout.double().abs()
    ds = p * (dout @ v.abs().transpose(-2, -1) + (dout * out.double().abs()).sum(-1, keepdim=True))
    dk = (ds.transpose(-2, -1) @ q.abs()).view(B, Hkv, H // Hkv, Nk, D).sum(2)
    return {"dQ": 2 * U32 * scale * (ds @ k.abs()).max().item(), "dK": 2 * U32 * scale * dk.max().item()}, ds


@torch.no_grad()
def tensor_floors(q, k, v, out, dout, keep, bias, scale):
    """cancellation_floors with a keep mask and a bias (tensor_probabilities):
    2 u times the terms that LSE (scale·|q|·|k| + |bias|), dQ and dK are
    summed from, and dBias = dS' (2 u times |dS|'s bound, summed where the
    bias broadcasts); out is the reference's O."""
    H, Hkv = q.shape[1], k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    bias = None if bias is None else bias.double()
    p, _, keep = tensor_probabilities(q, k, keep, bias, scale)
    terms = scale * (q.abs() @ k.abs().transpose(-2, -1)) + (0.0 if bias is None else bias.abs())
    floors = {"LSE": 2 * U32 * terms.masked_fill(~keep, 0.0).max().item()}
    if dout is not None:
        gradient_floors, ds = _gradient_floors(p, q, k, v, out, dout, scale, Hkv)
        floors.update(gradient_floors)
        if bias is not None:
            floors["dBias"] = 2 * U32 * ds.sum_to_size(bias.shape).max().item()
    return floors


def rounding_floor(ref, dtype):
    """2 x the largest rounding error to `dtype` (the output's) of ref's finite
    entries, at their size + 0.3 (FlashAttention's form). Both sides of the
    rule end in that rounding; where the yardstick's lands near a grid point
    and ours near a midpoint, 2 x its error does not cover ours (an fp16 dQ of
    1.08: 1e-4 against 5e-4 from the cast alone)."""
    finite = ref[torch.isfinite(ref)].double()
    if finite.numel() == 0:
        return 0.0
    return 2 * ((finite + 0.3).to(dtype).double() - 0.3 - finite).abs().max().item()


def judge(ours, ref, low, what, floor=0.0):
    """The rule for one output (O, LSE, dQ, dK or dV) against the reference,
    `low` the yardstick, `floor` what its cancellation adds to the output's
    rounding: (err, bound, problem), problem None when it passes, else one
    line saying why."""
    if ours.shape != ref.shape:
        return math.nan, math.nan, f"{what}: shape {list(ours.shape)}, the reference's {list(ref.shape)}"
    dtype = ours.dtype
    ours, ref, low = ours.double(), ref.double(), low.double()
    if torch.isnan(ours).any():
        return math.nan, math.nan, f"{what}: NaN"
    if torch.isposinf(ours).any():
        return math.inf, math.nan, f"{what}: +inf"
    empty = torch.isneginf(ref)
    if not torch.equal(torch.isneginf(ours), empty):
        return math.inf, math.nan, f"{what}: -inf where the reference has none, or the reverse"
    finite = ~empty
    ours_err = (ours - ref)[finite].abs().max().item() if finite.any() else 0.0
    low_err = (low - ref)[finite].abs().max().item() if finite.any() else 0.0
    bound = 2 * low_err + rounding_floor(ref, dtype) + floor
    if not math.isfinite(bound):  # a yardstick that overflowed or has NaN judges nothing
        return ours_err, bound, f"{what}: the same-precision error is {low_err}, the rule cannot judge"
    if not ours_err <= bound:
        return ours_err, bound, f"{what}: err {ours_err:.3e} > 2 x same-precision err {low_err:.3e} + floor"
    return ours_err, bound, None


def judge_outputs(ours, ref, low, floors):
    """judge for each of ours, (out, lse[, dq, dk, dv[, dbias]]), against ref
    and low, with its floor in `floors` (0 where none): ([(output, err,
    bound)], problems)."""
    results, problems = [], []
    for what, o, r, lo in zip(OUTPUTS + ("dBias",), ours, ref, low):
        # a float32 bias's gradient is that of its cast to the inputs' dtype: judged in that dtype
        err, bound, problem = judge(o.to(lo.dtype) if what == "dBias" else o, r, lo, what, floors.get(what, 0.0))
        results.append((what, err, bound))
        problems += [problem] if problem else []
    return results, problems


def unseen(mask_spec, B, Nq, Nk, doc_ids):
    """(rows, keys): bool [B or 1, 1, Nq], True for a query row that sees no
    key, and [B or 1, 1, Nk], True for a key that no query sees, under the
    mask_mod (none of mods.h's depends on the head)."""
    Bm = B if doc_ids is not None else 1
    b = torch.arange(Bm, device=DEVICE)[:, None, None, None]
    h = torch.zeros(1, device=DEVICE, dtype=torch.long)[None, :, None, None]
    i = torch.arange(Nq, device=DEVICE)[None, None, :, None]
    j = torch.arange(Nk, device=DEVICE)[None, None, None, :]
    keep = torch.as_tensor(mask_fn(mask_spec, Nq, Nk, doc_ids)(b, h, i, j), device=DEVICE).expand(Bm, 1, Nq, Nk)
    return ~keep.any(dim=-1), ~keep.any(dim=-2)


def zero_where_unseen(c, doc_ids, out, grads=None):
    """Where O (and dQ) are not exactly 0 on rows that see no key and dK, dV
    on keys that no query sees, one line each."""
    rows, keys = unseen(c.mask, c.B, c.Nq, c.Nk, doc_ids)
    problems = []
    for name, t, where in (("O", out, rows), *zip(("dQ", "dK", "dV"), grads or (), (rows, keys, keys))):
        if not (t[where.expand(t.shape[:3])] == 0).all():
            problems.append(f"{name} is not 0 on a {'row that sees no key' if where is rows else 'key no query sees'}")
    return problems


def unreached(c, keep, ours, bias_shape):
    """zero_where_unseen for the tensor mods: one line each where O and dQ are
    not exactly 0 on rows that see no key, dK and dV on keys that no query
    sees, dBias (ours[5], of the bias's shape bias_shape) on elements no kept
    pair reads; keep broadcasts to [B, H, Q_LEN, KV_LEN]."""
    keep = keep.expand(c.B, c.H, c.Nq, c.Nk)
    rows = ~keep.any(dim=-1)
    keys = ~keep.reshape(c.B, c.Hkv, c.H // c.Hkv, c.Nq, c.Nk).any(dim=3).any(dim=2)
    problems = [f"{name} is not 0 where no kept pair reaches it"
                for name, t, where in zip(("O", "dQ", "dK", "dV"), (ours[0], *ours[2:5]), (rows, rows, keys, keys))
                if not (t[where] == 0).all()]
    if len(ours) == 6:
        shape = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
        read = keep.to(torch.int32).sum_to_size(shape) > 0
        if not (ours[5].reshape(shape)[~read] == 0).all():
            problems.append("dBias is not 0 where no kept pair reads it")
    return problems


def check(c, ours, q, k, v, doc_ids, dout=None):
    """Case c's outputs `ours`, (out, lse) or (out, lse, dq, dk, dv) for the
    upstream gradient dout, by the rule: ([(output, err, bound)], problems),
    problems a list of lines, empty when they all pass. With dout the
    reference runs its backward even where ours holds no gradients: torch
    compiles flex_attention anew for inputs that do not require grad, and
    compiling is most of a small case's time."""
    assert len(ours) == 2 or (len(ours) == 5 and dout is not None), "(out, lse) or, with dout, the gradients too"
    ref, low = reference(q, k, v, c.mask, c.score, c.block, c.gqa, doc_ids, scale=c.scale, dout=dout)
    floors = cancellation_floors(q, k, v, ref[0], dout, c.mask, c.score, doc_ids, c.scale)
    results, problems = judge_outputs(ours, ref, low, floors)
    return results, problems + zero_where_unseen(c, doc_ids, ours[0], ours[2:])


# ---- the cases --------------------------------------------------------------------------
class Case:
    """One problem: mask and score specs, lengths, heads (Hkv < H: GQA or
    MQA), head dims, dtype, block size (Q, KV), scale (None: 1/sqrt(D)), and
    whether its backward runs under torch.use_deterministic_algorithms(True)."""

    def __init__(self, mask="causal", score=None, Nq=256, Nk=256, B=1, H=2, Hkv=None, D=128, Dv=None,
                 dtype=torch.bfloat16, block=(128, 128), scale=None, deterministic=False):
        self.mask, self.score, self.Nq, self.Nk, self.B, self.H = mask, score, Nq, Nk, B, H
        self.Hkv, self.D, self.Dv, self.dtype, self.block = Hkv or H, D, Dv or D, dtype, block
        self.scale, self.deterministic = scale, deterministic

    @property
    def gqa(self):
        return self.Hkv != self.H

    def __repr__(self):
        dims = f"D{self.D}" if self.Dv == self.D else f"D{self.D}/{self.Dv}"
        heads = f"H{self.H}" if self.Hkv == self.H else f"H{self.H}kv{self.Hkv}"
        return (f"{self.mask}+{self.score or 'none'}-{self.Nq}x{self.Nk}-B{self.B}{heads}-{dims}-"
                f"{str(self.dtype)[6:]}-{self.block[0]}x{self.block[1]}"
                + ("" if self.scale is None else f"-scale{self.scale:g}") + ("-det" if self.deterministic else ""))


class TensorCase(Case):
    """A Case whose mask_mod is a keep tensor (keep: its pattern, keep_mask's;
    None for the spec `mask`) and whose score_mod is a bias tensor (bias: its
    shape; None for none). Shapes are written in the dims' letters, 1 where
    the tensor broadcasts: "BHQK" is [B, H, Q_LEN, KV_LEN], "1H1K" a key
    mask per head, "QK" 2-D. keep_as: what create_block_mask gets, the bool
    mask, "uint8" (nonzero = keep) or "packed" (attnlab.pack_mask's);
    bias_dtype: None for the inputs' dtype."""

    def __init__(self, keep=None, bias=None, mask="none", keep_shape="BHQK", keep_as="bool", bias_dtype=None, **kw):
        super().__init__("tensor" if keep else mask, None, **kw)
        self.keep, self.keep_shape, self.keep_as = keep, keep_shape, keep_as
        self.bias, self.bias_dtype = bias, bias_dtype

    def shape(self, letters):
        dims = {"B": self.B, "H": self.H, "Q": self.Nq, "K": self.Nk, "1": 1}
        return tuple(dims[d] for d in letters)

    def __repr__(self):
        mask = f"keep[{self.keep},{self.keep_shape},{self.keep_as}]" if self.keep else self.mask
        score = "none" if self.bias is None else (
            f"bias[{self.bias}" + (f",{str(self.bias_dtype)[6:]}" if self.bias_dtype else "") + "]")
        return f"{mask}+{score}-" + super().__repr__().split("-", 1)[1]


def make_inputs(c, seeds):
    """Fresh normal q, k, v of case c, from the next seed of the iterator
    `seeds`, and the document mask_mod's ids (int32 [B, max(Nq, Nk)], from
    the seed after) or None. Draws from torch's global generator, so that
    what the caller draws next (an upstream gradient) follows from the seed."""
    torch.manual_seed(next(seeds))
    q = torch.randn(c.B, c.H, c.Nq, c.D, device=DEVICE, dtype=c.dtype)
    k = torch.randn(c.B, c.Hkv, c.Nk, c.D, device=DEVICE, dtype=c.dtype)
    v = torch.randn(c.B, c.Hkv, c.Nk, c.Dv, device=DEVICE, dtype=c.dtype)
    doc_ids = None
    if c.mask == "document":
        N = max(c.Nq, c.Nk)
        rng = random.Random(next(seeds))
        docs = mods.random_document_ids(c.B, N, rng.randint(1, min(N, 8)), rng)
        doc_ids = torch.tensor(docs, dtype=torch.int32, device=DEVICE)
    return q, k, v, doc_ids


def upstream_gradient(c):
    """dO of case c: fresh normal values in its dtype, [B, H, Nq, Dv]."""
    return torch.randn(c.B, c.H, c.Nq, c.Dv, device=DEVICE, dtype=c.dtype)


def keep_mask(pattern, shape, block, gen=None):
    """A bool keep mask of `shape`, drawn from the torch.Generator `gen`
    (None: torch's global one). "random": each pair kept with probability
    1/2. "blocks": each (Q, KV) block of `block` (of 1 row where Q_LEN
    broadcasts) empty or full with probability 1/4 each, else "random", so
    that the block mask has all three kinds. "keypad": each row's first n
    keys, n in [1, KV_LEN] drawn per row of the mask (a key-padding mask; at
    [1, H, 1, KV_LEN] one n per head). "topk": each row's KV_LEN // 8 + 1 keys
    of largest random score. "holes": "random" with about 1 row in 8 and 1
    key in 8 dropped (rows that see no key, keys that no query sees)."""
    rows, keys = shape[:-1], shape[-1]
    if pattern == "blocks":
        bq = block[0] if shape[-2] > 1 else 1
        kind = torch.randint(0, 4, (*shape[:-2], -(-shape[-2] // bq), -(-keys // block[1])), device=DEVICE,
                             generator=gen)
        kind = kind.repeat_interleave(bq, dim=-2)[..., :shape[-2], :].repeat_interleave(block[1], dim=-1)[..., :keys]
        return (kind == 1) | ((kind >= 2) & (torch.rand(shape, device=DEVICE, generator=gen) < 0.5))
    if pattern == "keypad":
        return torch.arange(keys, device=DEVICE) < torch.randint(1, keys + 1, (*rows, 1), device=DEVICE, generator=gen)
    if pattern == "topk":
        score = torch.rand(shape, device=DEVICE, generator=gen)
        return score >= score.topk(keys // 8 + 1, dim=-1).values[..., -1:]
    keep = torch.rand(shape, device=DEVICE, generator=gen) < 0.5
    if pattern == "holes":
        keep &= ((torch.rand((*rows, 1), device=DEVICE, generator=gen) >= 1 / 8)
                 & (torch.rand(keys, device=DEVICE, generator=gen) >= 1 / 8))
    return keep


def spec_keep(mask_spec, Nq, Nk):
    """bool [Nq, Nk]: the pairs that mask_spec keeps, for a spec whose pairs
    depend on neither b nor h (not document's)."""
    i = torch.arange(Nq, device=DEVICE)[:, None]
    j = torch.arange(Nk, device=DEVICE)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=DEVICE)
    return torch.as_tensor(mask_fn(mask_spec, Nq, Nk, None)(zero, zero, i, j), device=DEVICE).expand(Nq, Nk)
