"""GPU tests of attnlab's block-sparse attention (python/attnlab/blocksparse.py):
attnlab.flex_attention against torch.nn.attention.flex_attention,
attnlab.create_block_mask against torch's create_block_mask (through
BlockMask.from_torch), and the errors they must raise.

    PYTHONPATH=build/python python3 -m pytest tests/python/test_blocksparse.py -q

The rule (FlashAttention's tests/cute/test_mask_mod.py, the project's):
torch's flex_attention in eager mode on fp32 copies of the inputs is the
reference, the same call in the inputs' dtype the yardstick; for O and for LSE
(its finite entries)
    max|ours - ref| <= 2 * max|flex_same_precision - ref| + floor,
    floor = 2 * max|(ref + 0.3 - 0.3) - ref| in fp32 (its rounding);
rows that see no key hold O = 0 and LSE = -inf, nothing is NaN. Where torch's
flex_attention refuses a shape (head dims that are not powers of 2, in torch
versions that do), the same computation written densely with torch ops, the
mask_mod and score_mod of attnlab.mods on index grids, stands in for it in
both precisions (P rounded to the dtype before P @ V, as flex's eager path).
Cases: the curated list below (every mask_mod and score_mod of mods.h, ragged
lengths, causal with Nq != Nk, GQA and MQA, D=192/Dv=128, blocks 128x128 and
256x256) and 60 random ones from a fixed seed.
"""
import inspect
import itertools
import random

import pytest
import torch
from torch.nn.attention import flex_attention as torch_flex_module

import attnlab
from attnlab import mods

DEVICE = "cuda"
_seed = itertools.count(7000)


# ---- the references ---------------------------------------------------------------------
def mask_fn(spec, Nq, Nk, doc_ids):
    return mods.torch_mask_mod(spec, Nq, Nk, doc_ids)


def torch_flex(q, k, v, mask_spec, score_spec, block_size, enable_gqa, doc_ids, scale=None):
    """(out, lse) of torch's flex_attention (eager) with the same mask_mod and
    score_mod written in Python, on q's dtype; lse natural log."""
    B, H, Nq, Nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    bm = torch_flex_module.create_block_mask(mask_fn(mask_spec, Nq, Nk, doc_ids), B if doc_ids is not None else None,
                                             None, Nq, Nk, device=q.device, BLOCK_SIZE=block_size)
    score = mods.torch_score_mod(score_spec, H)
    params = inspect.signature(torch_flex_module.flex_attention).parameters
    if "return_aux" in params:  # newer torch: the LSE through AuxRequest
        out, aux = torch_flex_module.flex_attention(q, k, v, score_mod=score, block_mask=bm, scale=scale,
                                                    enable_gqa=enable_gqa,
                                                    return_aux=torch_flex_module.AuxRequest(lse=True))
        return out, aux.lse
    return torch_flex_module.flex_attention(q, k, v, score_mod=score, block_mask=bm, scale=scale,
                                            enable_gqa=enable_gqa, return_lse=True)


def dense_flex(q, k, v, mask_spec, score_spec, enable_gqa, doc_ids, scale=None):
    """What flex_attention's eager path computes, written out densely: scores in
    fp32 from q @ k^T in q's dtype, the score_mod, the mask, P rounded to q's
    dtype before P @ V; a row without keys: out 0, lse -inf."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if k.shape[1] != H:
        k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    scale = D ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)).float() * scale
    b = torch.arange(B, device=q.device)[:, None, None, None]
    h = torch.arange(H, device=q.device)[None, :, None, None]
    i = torch.arange(Nq, device=q.device)[None, None, :, None]
    j = torch.arange(Nk, device=q.device)[None, None, None, :]
    score = mods.torch_score_mod(score_spec, H)
    if score is not None:
        s = score(s, b, h, i, j)
    keep = torch.as_tensor(mask_fn(mask_spec, Nq, Nk, doc_ids)(b, h, i, j), device=q.device).expand(s.shape)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p.to(q.dtype) @ v, lse


def reference(q, k, v, mask_spec, score_spec, block_size, enable_gqa, doc_ids):
    """(out, lse) in fp32 and in q's dtype, from torch's flex_attention or, where
    it refuses the shape, dense_flex."""
    q32, k32, v32 = (t.float() for t in (q, k, v))
    try:
        return (torch_flex(q32, k32, v32, mask_spec, score_spec, block_size, enable_gqa, doc_ids),
                torch_flex(q, k, v, mask_spec, score_spec, block_size, enable_gqa, doc_ids))
    except (ValueError, NotImplementedError) as error:  # e.g. "NYI: ... non power of 2 embedding dimension"
        if "dimension" not in str(error) and "head" not in str(error):
            raise
    return (dense_flex(q32, k32, v32, mask_spec, score_spec, enable_gqa, doc_ids),
            dense_flex(q, k, v, mask_spec, score_spec, enable_gqa, doc_ids))


def rounding_floor(ref):
    finite = ref[torch.isfinite(ref)]
    if finite.numel() == 0:
        return 0.0
    return 2 * ((finite + 0.3) - 0.3 - finite).abs().max().item()


def assert_matches(ours, ref, low, what):
    """The rule for one output (O or LSE) against the fp32 reference."""
    ours, ref, low = ours.float(), ref.float(), low.float()
    assert not torch.isnan(ours).any(), f"{what}: NaN"
    empty = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(ours), empty), f"{what}: -inf where the reference has none, or the reverse"
    finite = ~empty
    ours_err = (ours - ref)[finite].abs().max().item() if finite.any() else 0.0
    low_err = (low - ref)[finite].abs().max().item() if finite.any() else 0.0
    bound = 2 * low_err + rounding_floor(ref)
    assert ours_err <= bound, f"{what}: err {ours_err:.3e} > 2 x same-precision err {low_err:.3e} + floor"


# ---- the cases --------------------------------------------------------------------------
class Case:
    def __init__(self, mask="causal", score=None, Nq=256, Nk=256, B=1, H=2, Hkv=None, D=128, Dv=None,
                 dtype=torch.bfloat16, block=(128, 128), docs=None):
        self.mask, self.score, self.Nq, self.Nk, self.B, self.H = mask, score, Nq, Nk, B, H
        self.Hkv, self.D, self.Dv, self.dtype, self.block = Hkv or H, D, Dv or D, dtype, block

    def __repr__(self):
        dims = f"D{self.D}" if self.Dv == self.D else f"D{self.D}/{self.Dv}"
        heads = f"H{self.H}" if self.Hkv == self.H else f"H{self.H}kv{self.Hkv}"
        return (f"{self.mask}+{self.score or 'none'}-{self.Nq}x{self.Nk}-B{self.B}{heads}-{dims}-"
                f"{str(self.dtype)[6:]}-{self.block[0]}x{self.block[1]}")


MASKS = ["none", "causal", "sliding_window:64,32", "sliding_window:128,0", "block_diagonal:100", "mini_causal:64",
         "prefix_lm:150", "dilated_sliding_window:256,2", "document"]
SCORES = [None, "rel_bias", "alibi", "softcap:2", "softcap:30"]
SHAPES = [(1, 1), (17, 17), (113, 203), (239, 1), (799, 3)]


def curated():
    cases = []
    for n, mask in enumerate(MASKS):  # every mask_mod over the ragged lengths, the score_mods in turn
        for m, (Nq, Nk) in enumerate(SHAPES):
            cases.append(Case(mask, SCORES[(n + m) % len(SCORES)], Nq, Nk))
    for score in SCORES:  # every score_mod with partial and full blocks, in both dtypes
        for dtype in (torch.bfloat16, torch.float16):
            cases.append(Case("prefix_lm:150", score, 333, 455, dtype=dtype))
    cases += [
        Case("causal", None, 1000, 300), Case("causal", "alibi", 300, 1000), Case("causal", "rel_bias", 1000, 300),
        Case("sliding_window:64,32", None, 520, 130),  # query blocks that see no key
        Case("causal", None, 4224, 4224), Case("document", "alibi", 4224, 4224),
        Case("causal", None, 128, 8192), Case("sliding_window:1024,0", "rel_bias", 128, 8192),
        Case("causal", None, 700, 900, H=4, Hkv=2), Case("document", "softcap:30", 513, 513, B=2, H=4, Hkv=1),
        Case("causal", None, 700, 700, D=192, Dv=128), Case("document", "softcap:30", 600, 600, D=192, Dv=128),
        Case("causal", "alibi", 799, 799, block=(256, 256)), Case("prefix_lm:150", None, 700, 900, block=(256, 256)),
        Case("mini_causal:64", "rel_bias", 1000, 1000, block=(256, 256), H=4, Hkv=1),
        Case("document", None, 1024, 1024, B=2, block=(256, 256)),
        Case("causal", None, 257, 513, D=64), Case("sliding_window:64,32", "softcap:2", 300, 1000, D=256),
        Case("none", "rel_bias", 300, 700, D=128, Dv=64),
    ]
    return cases


def random_cases(count=60, seed=20260101):
    rng = random.Random(seed)
    dims = [(64, 64), (128, 128), (192, 128), (256, 256), (128, 64)]
    heads = [(1, 2, 2), (2, 2, 2), (1, 4, 2), (1, 4, 1), (2, 3, 1)]
    blocks = [(128, 128), (256, 256), (128, 256), (256, 128)]
    masks = ["none", "causal", "document",
             lambda: f"sliding_window:{rng.randint(0, 300)},{rng.randint(0, 300)}",
             lambda: f"block_diagonal:{rng.randint(1, 400)}", lambda: f"mini_causal:{rng.randint(1, 200)}",
             lambda: f"prefix_lm:{rng.randint(0, 600)}",
             lambda: f"dilated_sliding_window:{rng.randint(0, 600)},{rng.randint(1, 4)}"]
    scores = [None, "rel_bias", "alibi", lambda: f"softcap:{rng.choice([1, 5, 20, 50])}"]
    cases = []
    for _ in range(count):
        mask, score = rng.choice(masks), rng.choice(scores)
        D, Dv = rng.choice(dims)
        B, H, Hkv = rng.choice(heads)
        cases.append(Case(mask() if callable(mask) else mask, score() if callable(score) else score,
                          rng.randint(1, 1500), rng.randint(1, 1500), B=B, H=H, Hkv=Hkv, D=D, Dv=Dv,
                          dtype=rng.choice([torch.bfloat16, torch.float16]), block=rng.choice(blocks)))
    return cases


def inputs(c):
    torch.manual_seed(next(_seed))
    q = torch.randn(c.B, c.H, c.Nq, c.D, device=DEVICE, dtype=c.dtype)
    k = torch.randn(c.B, c.Hkv, c.Nk, c.D, device=DEVICE, dtype=c.dtype)
    v = torch.randn(c.B, c.Hkv, c.Nk, c.Dv, device=DEVICE, dtype=c.dtype)
    doc_ids = None
    if c.mask == "document":
        N = max(c.Nq, c.Nk)
        rng = random.Random(next(_seed))
        docs = mods.random_document_ids(c.B, N, rng.randint(1, min(N, 8)), rng)
        doc_ids = torch.tensor(docs, dtype=torch.int32, device=DEVICE)
    return q, k, v, doc_ids


@pytest.mark.parametrize("c", curated() + random_cases(), ids=repr)
def test_flex_attention_matches_torch(c):
    q, k, v, doc_ids = inputs(c)
    bm = attnlab.create_block_mask(c.mask, c.B if doc_ids is not None else None, None, c.Nq, c.Nk,
                                   BLOCK_SIZE=c.block, doc_ids=doc_ids)
    gqa = c.Hkv != c.H
    out, lse = attnlab.flex_attention(q, k, v, block_mask=bm, score_mod=c.score, enable_gqa=gqa, return_lse=True)
    assert out.dtype == q.dtype and out.shape == (c.B, c.H, c.Nq, c.Dv) and lse.shape == (c.B, c.H, c.Nq)
    (ref_out, ref_lse), (low_out, low_lse) = reference(q, k, v, c.mask, c.score, c.block, gqa, doc_ids)
    assert_matches(out, ref_out, low_out, "O")
    assert_matches(lse, ref_lse, low_lse, "LSE")
    empty = torch.isneginf(ref_lse)
    assert (out[empty] == 0).all(), "a row without keys must give O = 0"


# ---- block masks: attnlab's against torch's ------------------------------------------------
BLOCK_MASK_CASES = [Case(mask, None, Nq, Nk, B=2 if mask == "document" else 1, block=block)
                    for mask in MASKS
                    for (Nq, Nk) in [(113, 203), (300, 1000), (512, 768), (1, 1), (128, 8192)]
                    for block in [(128, 128), (256, 256)]]


@pytest.mark.parametrize("c", BLOCK_MASK_CASES, ids=repr)
def test_from_torch_equals_create_block_mask(c):
    """Block for block, attnlab's classification equals torch's, but where torch
    pads a ragged last block with False: a block attnlab calls full there may
    be partial in torch's (docs/blocksparse.md's boundary rule). Without ragged
    blocks the 8 tensors are equal."""
    _, _, _, doc_ids = inputs(c)
    B = c.B if doc_ids is not None else None
    ours = attnlab.create_block_mask(c.mask, B, None, c.Nq, c.Nk, BLOCK_SIZE=c.block, doc_ids=doc_ids)
    theirs_torch = torch_flex_module.create_block_mask(mask_fn(c.mask, c.Nq, c.Nk, doc_ids), B, None, c.Nq, c.Nk,
                                                       device=DEVICE, BLOCK_SIZE=c.block)
    theirs = attnlab.BlockMask.from_torch(theirs_torch, mask_mod=c.mask, doc_ids=doc_ids)
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
    if not ragged.any():
        for name, a, t in zip(attnlab.blocksparse.FIELDS, ours.tensors(), theirs.tensors()):
            assert torch.equal(a, t), name
    # torch's as_tuple() converts the same way.
    assert all(torch.equal(a, t) for a, t in zip(
        attnlab.BlockMask.from_torch(theirs_torch.as_tuple(), mask_mod=c.mask, doc_ids=doc_ids).tensors(),
        theirs.tensors()))


def test_flex_attention_on_torchs_block_mask():
    """The same attention from attnlab's block mask and from torch's (ragged: a
    boundary block partial in torch's), both by the rule."""
    c = Case("causal", "alibi", 300, 1000, H=4, Hkv=2)
    q, k, v, _ = inputs(c)
    theirs = attnlab.BlockMask.from_torch(torch_flex_module.create_block_mask(
        mask_fn(c.mask, c.Nq, c.Nk, None), None, None, c.Nq, c.Nk, device=DEVICE), mask_mod="causal")
    out, lse = attnlab.flex_attention(q, k, v, block_mask=theirs, score_mod=c.score, enable_gqa=True, return_lse=True)
    (ref_out, ref_lse), (low_out, low_lse) = reference(q, k, v, c.mask, c.score, c.block, True, None)
    assert_matches(out, ref_out, low_out, "O")
    assert_matches(lse, ref_lse, low_lse, "LSE")


def test_default_block_mask_is_full_attention():
    q, k, v, _ = inputs(Case(Nq=300, Nk=500))
    out = attnlab.flex_attention(q, k, v)
    (ref_out, _), (low_out, _) = reference(q, k, v, "none", None, (128, 128), False, None)
    assert_matches(out, ref_out, low_out, "O")


def test_kept_pairs_counts_the_mask():
    for spec, Nq, Nk in [("causal", 300, 1000), ("sliding_window:64,32", 777, 555), ("mini_causal:64", 256, 256)]:
        keep = torch_flex_module.create_mask(mask_fn(spec, Nq, Nk, None), 2, 3, Nq, Nk, device=DEVICE)
        assert attnlab.kept_pairs(spec, 2, 3, Nq, Nk) == int(keep.sum())


def test_python_specs_agree_with_the_kernels():
    good = ["none", "causal", "sliding_window:0,0", "sliding_window:128,0", "block_diagonal:1", "mini_causal:64",
            "prefix_lm:0", "dilated_sliding_window:256,2", "document"]
    bad = ["", "nope", "causal:1", "sliding_window", "sliding_window:1", "sliding_window:1,2,3", "sliding_window:a,b",
           "block_diagonal:0", "mini_causal:-1", "dilated_sliding_window:4,0", "document:2"]
    for spec in good:
        assert attnlab._C.parse_mask_mod(spec, 100, 200) == mods.canonical_mask_spec(spec)
    for spec in bad:
        with pytest.raises(ValueError):
            attnlab._C.parse_mask_mod(spec, 100, 200)
        with pytest.raises(ValueError):
            mods.parse_mask_spec(spec)
    for spec in ["none", "rel_bias", "alibi", "softcap:30", "softcap:0.5"]:
        attnlab._C.parse_score_mod(spec, 8)
        mods.parse_score_spec(spec)
    for spec in ["softcap", "softcap:0", "softcap:-1", "softcap:x", "alibi:2", "tanh"]:
        with pytest.raises(ValueError):
            attnlab._C.parse_score_mod(spec, 8)
        with pytest.raises(ValueError):
            mods.parse_score_spec(spec)


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


def test_backward_is_not_available_yet():
    q, k, v, _ = (t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in inputs(Case(Nq=256, Nk=256)))
    out = attnlab.flex_attention(q, k, v, block_mask=attnlab.create_block_mask("causal", None, None, 256, 256))
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="the block-sparse backward is not available yet"):
        out.sum().backward()
