"""GPU tests of attnlab's block-sparse attention (python/attnlab/blocksparse.py):
attnlab.flex_attention, forward and backward, against
torch.nn.attention.flex_attention, attnlab.create_block_mask against torch's
create_block_mask (through BlockMask.from_torch), and the errors they must
raise.

    PYTHONPATH=build/python python3 -m pytest tests/python/test_blocksparse.py -q

The reference, the yardstick and the rule are flex_reference.py's (beside
this file, shared with scripts/fuzz_blocksparse.py): torch's flex_attention
in eager mode on float64 copies of the inputs, the same call in the inputs'
dtype, and for O, LSE, dQ, dK, dV each on its own
max|ours - ref| <= 2 * max|flex_same_precision - ref| + a floor of fp32
roundings; rows that see no key hold O = 0, LSE = -inf and dQ = 0, keys that
no query sees dK = dV = 0, nothing is NaN.
Cases: the curated list below (every mask_mod and score_mod of mods.h over
ragged lengths, causal with Nq != Nk, GQA and MQA, D=64, 128, 192/128, 256,
and 128/64, which only the forward takes; fp16 and bf16; blocks
128x128 and 256x256) and 60 random ones from a fixed seed, each the forward
and, where the backward takes its head dims, the backward for a fresh
upstream gradient. Then the deterministic backward bitwise over 5 runs,
gradients through return_lse=True, and the backward's refusal of the head
dims it does not take.

Tensor mods (a keep mask as the mask_mod, a bias as the score_mod, as torch
closures over tensors would be) have their own reference: the attention
written densely with torch ops, softmax(scale·q·kᵀ + bias, masked) @ v, its
gradients (dBias too) from torch's autograd, in float64 (the reference) and
in the inputs' dtype (the yardstick, flex's eager arithmetic: flex_reference's
dense stand-in), by the same rule, dBias on its own like dQ, dK and dV.
"""
import itertools
import random

import pytest
import torch
from torch.nn.attention import flex_attention as torch_flex_module

import attnlab
from attnlab import mods
from flex_reference import (BWD_HEAD_DIMS, DEVICE, MASK_DRAWS, MASKS, SCORE_DRAWS, SCORES, Case, TensorCase, check,
                            judge_outputs, keep_mask, make_inputs, mask_fn, spec_keep, tensor_floors,
                            tensor_probabilities, unreached, upstream_gradient)

_seed = itertools.count(7000)


def assert_passes(c, ours, q, k, v, doc_ids, dout=None):
    """ours, (out, lse) or with the upstream gradient dout (out, lse, dq, dk,
    dv), each by the rule, and 0 where no pair reaches them."""
    _, problems = check(c, ours, q, k, v, doc_ids, dout)
    assert not problems, "; ".join(problems)


def inputs(c):
    return make_inputs(c, _seed)


# ---- forward and backward against torch's flex_attention -----------------------------------
SHAPES = [(1, 1), (17, 17), (113, 203), (239, 1), (799, 3), (300, 1000)]
bf16, fp16 = torch.bfloat16, torch.float16


def curated():
    cases = []
    for n, mask in enumerate(MASKS):  # every mask_mod over the ragged lengths, the score_mods and dtypes in turn
        for m, (Nq, Nk) in enumerate(SHAPES):
            cases.append(Case(mask, SCORES[(n + m) % len(SCORES)], Nq, Nk, dtype=(bf16, fp16)[(n + m) % 2]))
    for score in SCORES:  # every score_mod with partial and full blocks, in both dtypes
        for dtype in (bf16, fp16):
            cases.append(Case("prefix_lm:150", score, 333, 455, dtype=dtype))
    cases += [
        Case("causal", None, 1000, 300), Case("causal", "alibi", 300, 1000, dtype=fp16),
        Case("causal", "rel_bias", 1000, 300), Case("causal", "softcap:30", 1000, 300, dtype=fp16),
        Case("sliding_window:64,32", None, 520, 130),  # query blocks that see no key: O = 0, dQ = 0
        Case("sliding_window:64,32", "rel_bias", 130, 520),  # key blocks that no query sees: dK = dV = 0
        Case("causal", None, 4224, 4224), Case("document", "alibi", 4224, 4224),
        Case("causal", None, 128, 8192), Case("sliding_window:1024,0", "rel_bias", 128, 8192),
        Case("causal", None, 700, 900, H=4, Hkv=2), Case("document", "softcap:30", 513, 513, B=2, H=4, Hkv=1),
        Case("causal", None, 700, 700, D=192, Dv=128), Case("document", "softcap:30", 600, 600, D=192, Dv=128),
        Case("sliding_window:128,0", "alibi", 300, 1000, H=4, Hkv=1, D=192, Dv=128, dtype=fp16),
        Case("causal", "alibi", 799, 799, block=(256, 256)), Case("prefix_lm:150", None, 700, 900, block=(256, 256)),
        Case("mini_causal:64", "rel_bias", 1000, 1000, block=(256, 256), H=4, Hkv=1),
        Case("document", None, 1024, 1024, B=2, block=(256, 256)),
        Case("dilated_sliding_window:256,2", "softcap:2", 900, 900, block=(256, 256), D=192, Dv=128, dtype=fp16),
        Case("causal", "alibi", 257, 513, D=64), Case("document", "rel_bias", 600, 600, B=2, H=4, Hkv=2, D=64),
        Case("document", None, 1024, 1024, B=2, block=(256, 256), D=64, dtype=fp16),
        Case("causal", None, 500, 500, scale=0.3),  # a scale of the caller's
        Case("sliding_window:64,32", "softcap:2", 300, 1000, D=256), Case("none", "rel_bias", 300, 700, D=128, Dv=64),
    ]
    return cases


def random_cases(count=60, seed=20260101):
    rng = random.Random(seed)
    dims = [(64, 64), (128, 128), (192, 128), (256, 256), (128, 64)]
    heads = [(1, 2, 2), (2, 2, 2), (1, 4, 2), (1, 4, 1), (2, 3, 1)]
    blocks = [(128, 128), (256, 256), (128, 256), (256, 128)]
    cases = []
    for _ in range(count):
        mask, score = rng.choice(MASK_DRAWS), rng.choice(SCORE_DRAWS)
        D, Dv = rng.choice(dims)
        B, H, Hkv = rng.choice(heads)
        cases.append(Case(mask(rng), score(rng), rng.randint(1, 1500), rng.randint(1, 1500), B=B, H=H, Hkv=Hkv,
                          D=D, Dv=Dv, dtype=rng.choice([bf16, fp16]), block=rng.choice(blocks)))
    return cases


def attnlab_outputs(c, q, k, v, doc_ids, dout=None, block_mask=None, bias=None):
    """(out, lse) of attnlab.flex_attention and, with an upstream gradient
    dout, its (dq, dk, dv) from autograd on fresh leaves copied from q, k, v;
    with a bias, the score_mod is that tensor (a leaf too: dbias follows)."""
    if block_mask is None:
        block_mask = attnlab.create_block_mask(c.mask, c.B if doc_ids is not None else None, None, c.Nq, c.Nk,
                                               BLOCK_SIZE=c.block, doc_ids=doc_ids)
    leaves = [t.detach().clone().requires_grad_(dout is not None) for t in (q, k, v, bias) if t is not None]
    q, k, v = leaves[:3]
    out, lse = attnlab.flex_attention(q, k, v, block_mask=block_mask, score_mod=c.score if bias is None else leaves[3],
                                      scale=c.scale, enable_gqa=c.gqa, return_lse=True)
    assert out.dtype == q.dtype and out.shape == (c.B, c.H, c.Nq, c.Dv) and lse.shape == (c.B, c.H, c.Nq)
    if dout is None:
        return out, lse
    grads = torch.autograd.grad(out, leaves, dout)
    for name, grad, t in zip(("dQ", "dK", "dV", "dBias"), grads, leaves):
        assert grad.dtype == t.dtype and grad.shape == t.shape, f"{name} is {grad.dtype} {list(grad.shape)}"
    return (out.detach(), lse, *grads)


@pytest.mark.parametrize("c", curated() + random_cases(), ids=repr)
def test_flex_attention_matches_torch(c):
    """O and LSE, and where the backward takes the head dims dQ, dK and dV for
    a fresh upstream gradient, each by the rule."""
    q, k, v, doc_ids = inputs(c)
    dout = upstream_gradient(c)
    ours = attnlab_outputs(c, q, k, v, doc_ids, dout if (c.D, c.Dv) in BWD_HEAD_DIMS else None)
    assert_passes(c, ours, q, k, v, doc_ids, dout)


# ---- block masks: attnlab's against torch's ------------------------------------------------
BLOCK_MASK_CASES = [Case(mask, None, Nq, Nk, B=2 if mask == "document" else 1, block=block)
                    for mask in MASKS
                    for (Nq, Nk) in [(113, 203), (300, 1000), (512, 768), (1, 1), (128, 8192)]
                    for block in [(128, 128), (256, 256)]]


def assert_same_kinds(c, ours, theirs):
    """Block for block, attnlab's classification `ours` equals `theirs` (from
    torch's), but where torch pads a ragged last block with False: a block
    attnlab calls full there may be partial in torch's (docs/blocksparse.md's
    boundary rule). Returns whether case c has ragged blocks."""
    assert theirs.mask_mod == ours.mask_mod and theirs.seq_lengths == ours.seq_lengths
    ka, kt = ours.kinds(), theirs.kinds()
    assert ka.shape == kt.shape
    ragged = torch.zeros_like(ka, dtype=torch.bool)
    if c.Nq % c.block[0]:
        ragged[:, :, -1, :] = True
    if c.Nk % c.block[1]:
        ragged[:, :, :, -1] = True
    allowed = (ka == 2) & (kt == 1) & ragged
    assert ((ka != kt) & ~allowed).sum() == 0, "block kinds differ away from the ragged boundary"
    return bool(ragged.any())


@pytest.mark.parametrize("c", BLOCK_MASK_CASES, ids=repr)
def test_from_torch_equals_create_block_mask(c):
    """assert_same_kinds; without ragged blocks the 8 tensors are equal."""
    _, _, _, doc_ids = inputs(c)
    B = c.B if doc_ids is not None else None
    ours = attnlab.create_block_mask(c.mask, B, None, c.Nq, c.Nk, BLOCK_SIZE=c.block, doc_ids=doc_ids)
    theirs_torch = torch_flex_module.create_block_mask(mask_fn(c.mask, c.Nq, c.Nk, doc_ids), B, None, c.Nq, c.Nk,
                                                       device=DEVICE, BLOCK_SIZE=c.block)
    theirs = attnlab.BlockMask.from_torch(theirs_torch, mask_mod=c.mask, doc_ids=doc_ids)
    if not assert_same_kinds(c, ours, theirs):
        for name, a, t in zip(attnlab.blocksparse.FIELDS, ours.tensors(), theirs.tensors()):
            assert torch.equal(a, t), name
    # torch's as_tuple() converts the same way.
    assert all(torch.equal(a, t) for a, t in zip(
        attnlab.BlockMask.from_torch(theirs_torch.as_tuple(), mask_mod=c.mask, doc_ids=doc_ids).tensors(),
        theirs.tensors()))


def test_flex_attention_on_torchs_block_mask():
    """The same attention from attnlab's block mask and from torch's (ragged: a
    boundary block partial in torch's), by the rule; the backward walks the
    transposed lists of torch's as well."""
    c = Case("causal", "alibi", 300, 1000, H=4, Hkv=2)
    q, k, v, _ = inputs(c)
    dout = upstream_gradient(c)
    theirs = attnlab.BlockMask.from_torch(torch_flex_module.create_block_mask(
        mask_fn(c.mask, c.Nq, c.Nk, None), None, None, c.Nq, c.Nk, device=DEVICE), mask_mod="causal")
    assert_passes(c, attnlab_outputs(c, q, k, v, None, dout, block_mask=theirs), q, k, v, None, dout)


def test_default_block_mask_is_full_attention():
    c = Case("none", None, 300, 500)
    q, k, v, _ = inputs(c)
    assert_passes(c, attnlab.flex_attention(q, k, v, return_lse=True), q, k, v, None)


def test_kept_pairs_counts_the_mask():
    for spec, Nq, Nk in [("causal", 300, 1000), ("sliding_window:64,32", 777, 555), ("mini_causal:64", 256, 256)]:
        keep = torch_flex_module.create_mask(mask_fn(spec, Nq, Nk, None), 2, 3, Nq, Nk, device=DEVICE)
        assert attnlab.kept_pairs(spec, 2, 3, Nq, Nk) == int(keep.sum())


def test_python_specs_agree_with_the_kernels():
    good = ["none", "causal", "sliding_window:0,0", "sliding_window:128,0", "block_diagonal:1", "mini_causal:64",
            "prefix_lm:0", "dilated_sliding_window:256,2", "document"]
    bad = ["", "nope", "causal:1", "sliding_window", "sliding_window:1", "sliding_window:1,2,3", "sliding_window:a,b",
           "block_diagonal:0", "mini_causal:-1", "dilated_sliding_window:4,0", "document:2", "prefix_lm:5,",
           "prefix_lm:+5", "sliding_window: 1,2", "prefix_lm:1073741825"]
    for spec in good:
        assert attnlab._C.parse_mask_mod(spec, 100, 200) == mods.canonical_mask_spec(spec)
    for spec in bad:
        with pytest.raises(ValueError):
            attnlab._C.parse_mask_mod(spec, 100, 200)
        with pytest.raises(ValueError):
            mods.parse_mask_spec(spec)
    for spec in ["none", "rel_bias", "alibi", "softcap:30", "softcap:0.5"]:  # named back as given
        assert attnlab._C.parse_score_mod(spec, 8) == spec
        mods.parse_score_spec(spec)
    for spec in ["softcap", "softcap:0", "softcap:-1", "softcap:x", "alibi:2", "tanh"]:
        with pytest.raises(ValueError):
            attnlab._C.parse_score_mod(spec, 8)
        with pytest.raises(ValueError):
            mods.parse_score_spec(spec)
    # The tensor mods: names of the kernels', not specs a user types (mods.py's docstring)
    assert attnlab._C.parse_mask_mod("tensor", 100, 200) == "tensor" and attnlab._C.parse_score_mod("bias", 8) == "bias"
    with pytest.raises(ValueError):
        mods.parse_mask_spec("tensor")
    with pytest.raises(ValueError):
        mods.parse_score_spec("bias")


# ---- errors: one line, the right type ------------------------------------------------------
def one_line(excinfo, *words):
    text = str(excinfo.value)
    assert "\n" not in text, text
    for w in words:
        assert w in text, text


def test_errors_are_one_line():
    q, k, v, _ = inputs(Case(Nq=300, Nk=300))
    with pytest.raises(ValueError) as e:
        attnlab.create_block_mask("nope", None, None, 300, 300)
    one_line(e, "attnlab.create_block_mask", "unknown mask_mod 'nope'")
    with pytest.raises(ValueError) as e:
        attnlab.create_block_mask("sliding_window:1", None, None, 300, 300)
    one_line(e, "takes LEFT,RIGHT")
    with pytest.raises(ValueError) as e:
        attnlab.create_block_mask("document", None, None, 300, 300)
    one_line(e, "needs doc_ids")
    with pytest.raises(TypeError) as e:
        attnlab.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 300, 300)
    one_line(e, "spec string")
    with pytest.raises(ValueError) as e:
        attnlab.flex_attention(q, k, v, score_mod="nope")
    one_line(e, "attnlab.flex_attention", "unknown score_mod 'nope'")
    with pytest.raises(TypeError) as e:
        attnlab.flex_attention(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s)
    one_line(e, "spec string")
    with pytest.raises(ValueError) as e:
        attnlab.flex_attention(q, k, v, block_mask=attnlab.create_block_mask("causal", None, None, 256, 300))
    one_line(e, "(Q_LEN, KV_LEN)")
    with pytest.raises(ValueError) as e:
        attnlab.flex_attention(q, k, v, block_mask=attnlab.create_block_mask("causal", None, None, 300, 300,
                                                                             BLOCK_SIZE=64))
    one_line(e, "not a multiple of the kernel tile")
    with pytest.raises(ValueError) as e:
        attnlab.flex_attention(q, k[:, :1], v[:, :1], block_mask=attnlab.create_block_mask("causal", None, None, 300,
                                                                                            300))
    one_line(e, "enable_gqa")


def test_from_torch_errors():
    torch_bm = torch_flex_module.create_block_mask(mask_fn("causal", 300, 300, None), None, None, 300, 300,
                                                   device=DEVICE)
    with pytest.raises(ValueError) as e:
        attnlab.BlockMask.from_torch(torch_bm)
    one_line(e, "partial blocks", "mask_mod=")
    with pytest.raises(ValueError) as e:
        attnlab.BlockMask.from_torch(torch_bm, mask_mod="nope")
    one_line(e, "unknown mask_mod")
    full = torch_flex_module.create_block_mask(mask_fn("none", 256, 256, None), None, None, 256, 256, device=DEVICE)
    assert attnlab.BlockMask.from_torch(full).mask_mod == "none"  # full blocks only: no mask_mod needed
    # Lists that are not a block mask: block_mask_invalid's reason.
    bad = attnlab.BlockMask.from_torch(torch_bm, mask_mod="causal").as_tuple()
    kv_indices = bad[3].clone()
    kv_indices[0, 0, 2, :2] = torch.tensor([1, 0], dtype=torch.int32)  # not ascending
    counts = bad[2].clone()
    counts[0, 0, 2] = 2
    with pytest.raises(ValueError) as e:
        attnlab.BlockMask.from_torch((*bad[:2], counts, kv_indices, *bad[4:]), mask_mod="causal")
    one_line(e, "not a valid block mask")


# ---- the backward's modes and refusals ------------------------------------------------------
DETERMINISTIC_CASES = [
    Case("causal", "alibi", 1000, 1000, H=4, Hkv=2, deterministic=True),
    Case("document", "softcap:30", 777, 777, B=2, D=64, deterministic=True),
    Case("none", None, 300, 2048, D=192, Dv=128, block=(256, 256), dtype=fp16, deterministic=True),
]


def deterministic_runs(run, count=5):
    """`count` results of run() under torch.use_deterministic_algorithms(True),
    after which the caller's setting is restored; each run's gradients (its
    items after out and lse) bitwise equal to the first run's."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [run() for _ in range(count)]
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    for n, again in enumerate(runs[1:], 2):
        for name, first, other in zip(("dQ", "dK", "dV", "dBias"), runs[0][2:], again[2:]):
            assert torch.equal(first, other), f"{name} of run {n} differs from run 1's"
    return runs


@pytest.mark.parametrize("c", DETERMINISTIC_CASES, ids=repr)
def test_deterministic_backward_is_bitwise_repeatable(c):
    """Under torch.use_deterministic_algorithms(True), 5 backward runs give the
    same bits, and they pass the rule; the caller's setting is restored."""
    q, k, v, doc_ids = inputs(c)
    dout = upstream_gradient(c)
    runs = deterministic_runs(lambda: attnlab_outputs(c, q, k, v, doc_ids, dout))
    assert_passes(c, runs[0], q, k, v, doc_ids, dout)


def test_gradients_flow_through_return_lse():
    """return_lse=True: out carries the gradients (lse is not differentiable),
    through .backward() into the leaves' .grad."""
    c = Case("sliding_window:128,0", "softcap:30", 400, 700, H=4, Hkv=2)
    q, k, v, doc_ids = inputs(c)
    dout = upstream_gradient(c)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    bm = attnlab.create_block_mask(c.mask, None, None, c.Nq, c.Nk)
    out, lse = attnlab.flex_attention(*leaves, block_mask=bm, score_mod=c.score, enable_gqa=True, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    (out.float() * dout.float()).sum().backward()
    assert_passes(c, (out.detach(), lse, *(t.grad for t in leaves)), q, k, v, doc_ids, dout)


@pytest.mark.parametrize("dims", [(128, 64)], ids=["128-64"])
def test_backward_refuses_head_dims_it_does_not_take(dims):
    """The forward takes D = 128/64, the backward does not: a ValueError with
    one line, raised from out.backward()."""
    D, Dv = dims
    c = Case("causal", None, 300, 300, D=D, Dv=Dv)
    q, k, v, _ = inputs(c)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attnlab.flex_attention(q, k, v, block_mask=attnlab.create_block_mask(c.mask, None, None, c.Nq, c.Nk))
    with pytest.raises(ValueError) as e:
        out.backward(upstream_gradient(c))
    one_line(e, "attnlab.flex_attention", "backward", "128/64")


# ---- tensor mods: a keep mask as the mask_mod, a bias as the score_mod -------------------------
def tensor_mods(c):
    """(keep, mask_mod, bias) of case c, drawn from torch's global generator
    (after make_inputs' q, k, v): keep the bool mask the reference applies
    (the spec's pairs where c.keep is None), mask_mod what create_block_mask
    gets, bias the score_mod tensor (standard normal) or None."""
    if c.keep:
        keep = keep_mask(c.keep, c.shape(c.keep_shape), c.block)
        mask_mod = keep
        if c.keep_as == "uint8":
            mask_mod = keep.to(torch.uint8) * torch.randint(1, 256, keep.shape, dtype=torch.uint8, device=DEVICE)
        elif c.keep_as == "packed":
            mask_mod = attnlab.pack_mask(keep)
    else:
        keep, mask_mod = spec_keep(c.mask, c.Nq, c.Nk), c.mask  # none of these specs reads b or h
    bias = None if c.bias is None else torch.randn(c.shape(c.bias), device=DEVICE, dtype=c.bias_dtype or c.dtype)
    return keep, mask_mod, bias


def dense_outputs(q, k, v, keep, bias, scale, dout=None):
    """(out, lse) of tensor_probabilities, P rounded to q's dtype before P·V
    (flex's eager path), and with an upstream gradient dout (dq, dk, dv) and,
    with a bias, dbias, from torch's autograd on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_(dout is not None) for t in (q, k, v, bias) if t is not None]
    q, k, v = leaves[:3]
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    p, lse, _ = tensor_probabilities(q, k, keep, leaves[3] if bias is not None else None, scale)
    out = p.to(q.dtype) @ v
    if dout is None:
        return out, lse
    grads = torch.autograd.grad(out, leaves, dout.to(out.dtype))
    return (out.detach(), lse, *grads)


def assert_tensor_passes(c, ours, q, k, v, keep, bias, dout=None):
    """ours, (out, lse) or with the upstream gradient dout (out, lse, dq, dk,
    dv[, dbias]), each by the rule against dense_outputs in float64 (the
    reference) and in the inputs' dtype (the yardstick), the bias as
    flex_attention reads it (cast to the inputs' dtype); and 0 where no kept
    pair reaches them."""
    scale = c.D ** -0.5 if c.scale is None else c.scale
    bias = None if bias is None else bias.to(c.dtype)
    wide_q, wide_k, wide_v, wide_bias = (None if t is None else t.double() for t in (q, k, v, bias))
    ref = dense_outputs(wide_q, wide_k, wide_v, keep, wide_bias, scale, dout)
    low = dense_outputs(q, k, v, keep, bias, scale, dout)
    floors = tensor_floors(q, k, v, ref[0], dout, keep, bias, scale)
    _, problems = judge_outputs(ours, ref, low, floors)
    problems += unreached(c, keep, ours, () if bias is None else bias.shape)
    assert not problems, "; ".join(problems)


TENSOR_CASES = [
    # keep masks: bool, uint8 and packed, each broadcast shape, ragged lengths, Nq != Nk, GQA and MQA, head dims
    TensorCase(keep="random", Nq=17, Nk=17, B=2),
    TensorCase(keep="random", keep_shape="11QK", keep_as="uint8", Nq=113, Nk=203, dtype=fp16),
    TensorCase(keep="blocks", keep_shape="B1QK", keep_as="packed", Nq=1000, Nk=1000, B=2, H=4, Hkv=2),
    TensorCase(keep="keypad", keep_shape="1H1K", Nq=239, Nk=1, H=4, Hkv=1, dtype=fp16),
    TensorCase(keep="keypad", keep_shape="1H1K", keep_as="packed", Nq=300, Nk=1000, H=4, Hkv=2),
    TensorCase(keep="topk", keep_shape="QK", Nq=300, Nk=1000),
    TensorCase(keep="blocks", keep_as="uint8", Nq=1000, Nk=300, D=64, dtype=fp16),
    TensorCase(keep="random", keep_shape="1HQK", keep_as="packed", Nq=700, Nk=900, D=192, Dv=128),
    TensorCase(keep="blocks", keep_shape="11QK", Nq=799, Nk=799, D=256, dtype=fp16),
    TensorCase(keep="keypad", keep_shape="B11K", Nq=513, Nk=513, B=2, H=4, Hkv=1),
    TensorCase(keep="blocks", Nq=1000, Nk=1000, block=(256, 256)),
    TensorCase(keep="topk", keep_shape="11QK", Nq=300, Nk=700, D=128, Dv=64),  # the forward only
    # bias score_mods: each broadcast shape, alone and with a spec mask_mod
    TensorCase(bias="QK", Nq=113, Nk=203),
    TensorCase(bias="1H1K", Nq=1000, Nk=1000, H=4, Hkv=2, dtype=fp16),
    TensorCase(bias="B1QK", mask="causal", Nq=300, Nk=1000, B=2),
    TensorCase(bias="BHQK", Nq=239, Nk=1, B=2, dtype=fp16),
    TensorCase(bias="11QK", mask="sliding_window:64,32", Nq=520, Nk=130),  # rows that see no key
    TensorCase(bias="1H1K", mask="causal", Nq=1000, Nk=300, D=64, dtype=fp16),
    TensorCase(bias="BHQK", mask="prefix_lm:150", Nq=333, Nk=455, B=2, D=192, Dv=128),
    TensorCase(bias="QK", bias_dtype=torch.float32, Nq=17, Nk=17),  # cast to bf16; its gradient float32
    TensorCase(bias="B1QK", Nq=300, Nk=700, B=2, D=256, dtype=fp16),
    TensorCase(bias="1HQK", mask="causal", Nq=799, Nk=799, H=4, block=(256, 256)),
    # a keep mask and a bias together
    TensorCase(keep="blocks", bias="BHQK", Nq=1000, Nk=1000, B=2, H=4, Hkv=2, dtype=fp16),
    TensorCase(keep="random", keep_shape="11QK", bias="1H1K", Nq=113, Nk=203),
    TensorCase(keep="topk", keep_shape="B1QK", bias="QK", Nq=700, Nk=900, B=2, D=64),
    TensorCase(keep="keypad", keep_shape="1H1K", keep_as="packed", bias="B1QK", Nq=799, Nk=3, B=2, H=4, dtype=fp16),
]


def tensor_case_outputs(c, q, k, v, mask_mod, bias, dout=None):
    """attnlab_outputs of case c on create_block_mask(mask_mod) and the bias."""
    bm = attnlab.create_block_mask(mask_mod, c.B, c.H, c.Nq, c.Nk, BLOCK_SIZE=c.block)
    return attnlab_outputs(c, q, k, v, None, dout, block_mask=bm, bias=bias)


@pytest.mark.parametrize("c", TENSOR_CASES, ids=repr)
def test_tensor_mods_match_the_dense_reference(c):
    """O and LSE and, where the backward takes the head dims, dQ, dK, dV and
    dBias for a fresh upstream gradient, each by the rule."""
    q, k, v, _ = inputs(c)
    keep, mask_mod, bias = tensor_mods(c)
    dout = upstream_gradient(c) if (c.D, c.Dv) in BWD_HEAD_DIMS else None
    ours = tensor_case_outputs(c, q, k, v, mask_mod, bias, dout)
    assert_tensor_passes(c, ours, q, k, v, keep, bias, dout)


@pytest.mark.parametrize("dtype", [bf16, fp16], ids=["bf16", "fp16"])
def test_tensor_mask_rows_that_see_no_key(dtype):
    """A keep mask with rows that see no key (a whole query block of one head
    among them: its key blocks are all empty) and keys that no query sees,
    under a full bias: on those rows O = 0, LSE = -inf, dQ = 0 and dBias = 0,
    on those keys dK = dV = 0, nothing NaN; the rest by the rule."""
    c = TensorCase(keep="holes", bias="BHQK", Nq=300, Nk=457, B=2, H=4, Hkv=2, dtype=dtype)
    q, k, v, _ = inputs(c)
    keep, _, bias = tensor_mods(c)
    keep[0, 1, 128:256] = False
    dout = upstream_gradient(c)
    rows = ~keep.any(dim=-1)
    assert rows.sum() > 128 and (~keep.any(dim=-2)).any(), "the case has rows and keys that nothing reaches"
    ours = tensor_case_outputs(c, q, k, v, keep, bias, dout)
    out, lse, dq, dk, dv, dbias = ours
    assert all(not torch.isnan(t).any() for t in ours)
    assert torch.isneginf(lse[rows]).all() and not torch.isinf(lse[~rows]).any()
    assert (out[rows] == 0).all() and (dq[rows] == 0).all() and (dbias[rows] == 0).all()
    assert_tensor_passes(c, ours, q, k, v, keep, bias, dout)


TENSOR_DETERMINISTIC_CASES = [
    TensorCase(keep="blocks", bias="1H1K", Nq=1000, Nk=1000, B=2, H=4, Hkv=2, deterministic=True),
    TensorCase(bias="B1QK", mask="causal", Nq=777, Nk=777, B=2, D=64, dtype=fp16, deterministic=True),
]


@pytest.mark.parametrize("c", TENSOR_DETERMINISTIC_CASES, ids=repr)
def test_deterministic_bias_gradient_is_bitwise_repeatable(c):
    """A broadcast bias under torch.use_deterministic_algorithms(True): 5 runs
    give the same bits of dQ, dK, dV and dBias (summed over the broadcast
    dims in a fixed order), and they pass the rule."""
    q, k, v, _ = inputs(c)
    keep, mask_mod, bias = tensor_mods(c)
    dout = upstream_gradient(c)
    runs = deterministic_runs(lambda: tensor_case_outputs(c, q, k, v, mask_mod, bias, dout))
    assert len(runs[0]) == 6
    assert_tensor_passes(c, runs[0], q, k, v, keep, bias, dout)


def block_kinds(keep, block):
    """int8 [B, H, M, N] of a bool keep mask [B, H, Q_LEN, KV_LEN]: 0 where a
    block keeps no pair, 2 where it keeps every pair in bounds (attnlab's
    boundary rule), else 1."""
    Nq, Nk = keep.shape[-2:]
    M, N = -(-Nq // block[0]), -(-Nk // block[1])

    def per_block(t):  # int [b, h, Q_LEN, KV_LEN] -> its sums [b, h, M, N]
        t = torch.nn.functional.pad(t, (0, N * block[1] - Nk, 0, M * block[0] - Nq))
        return t.reshape(t.shape[0], t.shape[1], M, block[0], N, block[1]).sum(dim=(3, 5))

    kept = per_block(keep.to(torch.int32))
    inside = per_block(torch.ones(1, 1, Nq, Nk, dtype=torch.int32, device=keep.device))
    return torch.where(kept == 0, 0, torch.where(kept == inside, 2, 1)).to(torch.int8)


@pytest.mark.parametrize("pattern, letters, given, block", [
    ("blocks", "BHQK", "bool", (128, 128)), ("random", "11QK", "uint8", (128, 128)),
    ("keypad", "1H1K", "packed", (256, 256)), ("blocks", "QK", "bool", (256, 128)),
    ("topk", "B1QK", "packed", (128, 256)),
], ids=lambda x: x if isinstance(x, str) else f"{x[0]}x{x[1]}")
def test_tensor_block_mask_is_the_masks_blocks(pattern, letters, given, block):
    """create_block_mask of a keep tensor: mask_mod "tensor" with its words,
    B and H the tensor's (1 where it broadcasts), each block empty, partial
    or full as the tensor's pairs in it; kept_pairs counts them."""
    c = TensorCase(keep=pattern, keep_shape=letters, keep_as=given, Nq=300, Nk=1000, B=2, H=3, block=block)
    torch.manual_seed(next(_seed))
    keep, mask_mod, _ = tensor_mods(c)
    bm = attnlab.create_block_mask(mask_mod, c.B, c.H, c.Nq, c.Nk, BLOCK_SIZE=block)
    keep = keep.reshape(c.shape(letters.rjust(4, "1")))
    assert bm.mask_mod == "tensor" and bm.mask_bits is not None
    assert bm.shape == (keep.shape[0], keep.shape[1], c.Nq, c.Nk)
    assert torch.equal(bm.kinds(), block_kinds(keep.expand(keep.shape[0], keep.shape[1], c.Nq, c.Nk), block))
    assert attnlab.kept_pairs(mask_mod, c.B, c.H, c.Nq, c.Nk) == int(keep.expand(c.B, c.H, c.Nq, c.Nk).sum())


def test_from_torch_with_a_keep_tensor():
    """A torch BlockMask made from a closure over a keep tensor converts with
    mask_mod=that tensor: its blocks are attnlab's (assert_same_kinds), and the
    attention on it passes the rule."""
    c = TensorCase(keep="blocks", keep_shape="B1QK", Nq=300, Nk=1000, B=2, H=4, Hkv=2)
    q, k, v, _ = inputs(c)
    keep, _, _ = tensor_mods(c)
    dout = upstream_gradient(c)
    theirs_torch = torch_flex_module.create_block_mask(lambda b, h, q_idx, kv_idx: keep[b, h, q_idx, kv_idx], c.B, 1,
                                                       c.Nq, c.Nk, device=DEVICE, BLOCK_SIZE=c.block)
    theirs = attnlab.BlockMask.from_torch(theirs_torch, mask_mod=keep)
    ours = attnlab.create_block_mask(keep, c.B, c.H, c.Nq, c.Nk, BLOCK_SIZE=c.block)
    assert theirs.mask_mod == "tensor" and theirs.shape == ours.shape == (c.B, 1, c.Nq, c.Nk)
    assert_same_kinds(c, ours, theirs)
    assert_tensor_passes(c, attnlab_outputs(c, q, k, v, None, dout, block_mask=theirs), q, k, v, keep, None, dout)


def test_tensor_mod_errors_are_one_line():
    q, k, v, _ = inputs(Case(Nq=300, Nk=300))
    keep = torch.ones(300, 300, dtype=torch.bool, device=DEVICE)
    torch_bm = torch_flex_module.create_block_mask(mask_fn("causal", 300, 300, None), None, None, 300, 300,
                                                   device=DEVICE)
    cases = [  # (call, exception, words of its message)
        (lambda: attnlab.flex_attention(q, k, v, score_mod=torch.randn(300, 299, device=DEVICE)), ValueError,
         ["attnlab.flex_attention", "bias score_mod", "does not broadcast"]),
        (lambda: attnlab.flex_attention(q, k, v, score_mod=torch.randn(3, 1, 300, 300, device=DEVICE)), ValueError,
         ["does not broadcast"]),
        (lambda: attnlab.flex_attention(q, k, v, score_mod=torch.randn(1, 1, 1, 300, 300, device=DEVICE)),
         ValueError, ["1 to 4 dims"]),
        (lambda: attnlab.flex_attention(q, k, v, score_mod=torch.ones(300, 300, dtype=torch.int32, device=DEVICE)),
         TypeError, ["floating-point"]),
        (lambda: attnlab.flex_attention(q, k, v, score_mod=torch.randn(300, 300)), ValueError, ["is on cpu"]),
        (lambda: attnlab.flex_attention(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s), TypeError,
         ["bias tensor", "not a callable"]),
        (lambda: attnlab.flex_attention(q, k, v, score_mod="bias"), ValueError, ["unknown score_mod 'bias'"]),
        (lambda: attnlab.create_block_mask(keep.float(), None, None, 300, 300), TypeError, ["bool or uint8"]),
        (lambda: attnlab.create_block_mask(keep[:, :299], None, None, 300, 300), ValueError,
         ["attnlab.create_block_mask", "does not broadcast"]),
        (lambda: attnlab.create_block_mask(keep.expand(2, 1, 300, 300), 3, None, 300, 300), ValueError,
         ["does not broadcast"]),
        (lambda: attnlab.create_block_mask(keep.cpu(), None, None, 300, 300), ValueError, ["must be on cuda"]),
        (lambda: attnlab.create_block_mask(attnlab.pack_mask(keep[:, :299]), None, None, 300, 300), ValueError,
         ["does not broadcast"]),
        (lambda: attnlab.create_block_mask(keep, None, None, 300, 300, doc_ids=torch.zeros(300, dtype=torch.int32)),
         ValueError, ["doc_ids"]),
        (lambda: attnlab.create_block_mask("tensor", None, None, 300, 300), ValueError, ["tensor mask_mod"]),
        (lambda: attnlab.kept_pairs(keep[:, :299], 1, 1, 300, 300), ValueError, ["attnlab.kept_pairs"]),
        (lambda: attnlab.BlockMask.from_torch(torch_bm, mask_mod=keep[:, :299]), ValueError,
         ["attnlab.BlockMask.from_torch", "does not broadcast"]),
    ]
    for call, error, words in cases:
        with pytest.raises(error) as e:
            call()
        one_line(e, *words)
