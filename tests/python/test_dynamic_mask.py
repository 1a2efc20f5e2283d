"""GPU tests of attnlab.dynamic_mask_attention, the autograd.Function over the
dynamic-mask kernels (kernels/dmattn/): forward and gradients against torch
autograd on a dense fp32 reference, plus the errors it must raise on bad input.

    PYTHONPATH=build/python python3 -m pytest tests/python/test_dynamic_mask.py -q

Pass rule, for O, dQ, dK, dV and dBias separately: max|ours - ref| <= 2 x the
same error of the same dense computation done by torch in the input dtype
(fp16/bf16) + 1e-3 x max|ref| + 1e-4, where ref is that computation in fp32
(the 1e-4 for gradients that are 0 in exact arithmetic, e.g. Nk = 1); LSE
within 1e-3. Inputs are fresh standard-normal values from a seed per case.
"""
import itertools

import pytest
import torch

import attnlab

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]
LSE_TOLERANCE = 1e-3
DEVICE = "cuda"
_seed = itertools.count(5000)


# ---- the reference: dense attention by torch ops, differentiable -------------------
def bottom_right_keep(nq, nk, device):
    """True where query i may see key j: j <= i + nk - nq (FlashAttention's alignment)."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + (nk - nq)


def per_query_head(x, H):
    """A [b, h, ...] operand with h in {H, Hkv, 1} as the H query heads see it."""
    return x if x.shape[1] in (1, H) else x.repeat_interleave(H // x.shape[1], dim=1)


def dense_attention(q, k, v, mask, bias, causal, scale, softcap):
    """(out, lse) in q's dtype (lse fp32); a row that sees no key gives out = 0,
    lse = -inf and no gradient (its scores are replaced before the softmax, so
    no NaN reaches autograd)."""
    H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
    k = per_query_head(k, H)
    v = per_query_head(v, H)
    s = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + per_query_head(bias, H)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = torch.ones(1, 1, Nq, Nk, dtype=torch.bool, device=q.device)
    if mask is not None:
        keep = keep & per_query_head(mask.bool(), H)
    if causal:
        keep = keep & bottom_right_keep(Nq, Nk, q.device)
    keep = keep.expand(s.shape)
    empty = ~keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s.detach().float(), dim=-1).masked_fill(empty[..., 0], float("-inf"))
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    return p @ v, lse


def forward_backward(fn, q, k, v, bias, dout, dtype):
    """fn's (out, lse, [dq, dk, dv(, dbias)]) on copies of the inputs cast to dtype."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    b = bias.detach().to(dtype).requires_grad_() if bias is not None else None
    out, lse = fn(*leaves, b)
    grads = torch.autograd.grad(out, leaves + ([b] if b is not None else []), dout.to(dtype))
    return out.detach(), lse, [g.detach() for g in grads]


def make_inputs(B, H, Hkv, nq, nk, d, dtype, mask_shape=None, bias_shape=None, keep=0.7):
    torch.manual_seed(next(_seed))
    q = torch.randn(B, H, nq, d, device=DEVICE, dtype=dtype)
    k = torch.randn(B, Hkv, nk, d, device=DEVICE, dtype=dtype)
    v = torch.randn(B, Hkv, nk, d, device=DEVICE, dtype=dtype)
    dout = torch.randn(B, H, nq, d, device=DEVICE, dtype=dtype)
    mask = torch.rand(mask_shape, device=DEVICE) < keep if mask_shape else None
    bias = torch.randn(bias_shape, device=DEVICE, dtype=dtype) if bias_shape else None
    return q, k, v, mask, bias, dout


def check(q, k, v, mask, bias, dout, causal=False, scale=None, softcap=None, deterministic=False, label="",
          mask_summary=None, ours_mask=None, backward=None):
    """Runs attnlab and both references; asserts the pass rule. Returns ours.
    ours_mask: what attnlab gets as attn_mask instead of `mask` (a PackedMask of it);
    backward: dynamic_mask_attention's (None: its choice)."""
    d = q.shape[-1]
    if backward == "engine" and not engine_takes(q, k, bias, softcap, deterministic):
        pytest.skip("the block-sparse engine's backward cannot take this problem here")
    ref_scale = d ** -0.5 if scale is None else scale
    given_mask = mask if ours_mask is None else ours_mask

    def ours(q_, k_, v_, b_):
        return attnlab.dynamic_mask_attention(q_, k_, v_, attn_mask=given_mask, attn_bias=b_, is_causal=causal,
                                              scale=scale, softcap=softcap, deterministic=deterministic,
                                              return_lse=True, mask_summary=mask_summary, backward=backward)

    def dense(q_, k_, v_, b_):
        return dense_attention(q_, k_, v_, mask, b_, causal, ref_scale, softcap)

    out, lse, grads = forward_backward(ours, q, k, v, bias, dout, q.dtype)
    ref_out, ref_lse, ref_grads = forward_backward(dense, q, k, v, bias, dout, torch.float32)
    low_out, _, low_grads = forward_backward(dense, q, k, v, bias, dout, q.dtype)

    assert out.dtype == q.dtype and out.shape == q.shape, label
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3], label
    names = ["O", "dQ", "dK", "dV", "dBias"]
    for name, x, ref, low in zip(names, [out] + grads, [ref_out] + ref_grads, [low_out] + low_grads):
        assert x.dtype == q.dtype and x.shape == ref.shape, f"{label} {name}: {x.dtype} {list(x.shape)}"
        assert torch.isfinite(x).all(), f"{label} {name}: {int((~torch.isfinite(x)).sum())} non-finite"
        err = float((x.float() - ref).abs().max())
        baseline = float((low.float() - ref).abs().max())
        tol = 2 * baseline + 1e-3 * float(ref.abs().max()) + 1e-4
        assert err <= tol, f"{label} {name}: err {err:.3e} > tol {tol:.3e} (same-precision torch err {baseline:.3e})"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{label}: LSE -inf where a row sees no key, only there"
    if (~empty).any():
        lse_err = float((lse - ref_lse)[~empty].abs().max())
        assert lse_err <= LSE_TOLERANCE, f"{label}: LSE err {lse_err:.3e}"
    return out, lse, grads


def engine_takes(q, k, bias=None, softcap=None, deterministic=False):
    """Whether the block-sparse engine's backward can take this problem here (backward="engine")."""
    bias = None if bias is None else attnlab.dynamic_mask._as_4d(bias, "bias")
    return not attnlab.dynamic_mask._engine_unfit(q, k, bias, softcap, bias is not None, deterministic)


# The numerics tests of the backward run each: its choice (None), kernels/dmattn/'s
# and the engine's (skipped where the engine cannot take the problem).
BACKWARDS = {"chosen": None, "dmattn": "dmattn", "engine": "engine"}
backwards = pytest.mark.parametrize("backward", BACKWARDS.values(), ids=BACKWARDS.keys())


# ---- numerics ------------------------------------------------------------------------
SIZES = [(17, 130), (129, 64), (1, 200), (128, 128), (65, 1)]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("nq,nk", SIZES, ids=[f"{a}x{b}" for a, b in SIZES])
@backwards
def test_matches_reference(dtype, causal, d, nq, nk, backward):
    """GQA (H=4, Hkv=2), a full random mask, a per-KV-head bias broadcast over queries."""
    B, H, Hkv = 2, 4, 2
    args = make_inputs(B, H, Hkv, nq, nk, d, dtype, mask_shape=(B, H, nq, nk), bias_shape=(B, Hkv, 1, nk))
    check(*args, causal=causal, backward=backward, label=f"{dtype} causal={causal} D={d} Nq={nq} Nk={nk} {backward}")


MASK_SHAPES = {"none": None, "BxHxNqxNk": "B H Nq Nk", "1x1xNqxNk": "1 1 Nq Nk", "BxHkvx1xNk": "B Hkv 1 Nk",
               "1xHx1xNk": "1 H 1 Nk"}
BIAS_SHAPES = {"none": None, "BxHkvx1xNk": "B Hkv 1 Nk", "1x1xNqxNk": "1 1 Nq Nk", "BxHxNqxNk": "B H Nq Nk",
               "1xHkvxNqxNk": "1 Hkv Nq Nk", "Bx1x1xNk": "B 1 1 Nk"}


def shape_of(spec, **dims):
    return None if spec is None else tuple(dims[s] if s in dims else int(s) for s in spec.split())


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hkv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("mask_spec", MASK_SHAPES.values(), ids=MASK_SHAPES.keys())
@pytest.mark.parametrize("bias_spec", BIAS_SHAPES.values(), ids=BIAS_SHAPES.keys())
@backwards
def test_broadcast_shapes(dtype, hkv, mask_spec, bias_spec, backward):
    B, H, nq, nk, d = 2, 4, 33, 97, 64
    dims = dict(B=B, H=H, Hkv=hkv, Nq=nq, Nk=nk)
    args = make_inputs(B, H, hkv, nq, nk, d, dtype, mask_shape=shape_of(mask_spec, **dims),
                       bias_shape=shape_of(bias_spec, **dims))
    check(*args, causal=True, backward=backward, label=f"{dtype} Hkv={hkv} mask {mask_spec} bias {bias_spec}")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_softcap(dtype, causal, softcap):
    B, H, Hkv, nq, nk = 2, 4, 2, 70, 150
    args = make_inputs(B, H, Hkv, nq, nk, 64, dtype, mask_shape=(B, 1, nq, nk), bias_shape=(B, H, nq, nk))
    check(*args, causal=causal, softcap=softcap, label=f"{dtype} causal={causal} softcap={softcap}")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, 70)], ids=["no_mask", "mask"])
@backwards
def test_softcap_without_bias(dtype, causal, d, mask_shape, backward):
    """A softcap alone (the engine's softcap score_mod), MQA, Nq > Nk."""
    B, H, Hkv, nq, nk = 2, 4, 1, 130, 70
    args = make_inputs(B, H, Hkv, nq, nk, d, dtype, mask_shape=mask_shape)
    check(*args, causal=causal, softcap=5.0, backward=backward, label=f"{dtype} causal={causal} D={d} softcap 5")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("mask_shape", [None, (2, 4, 150, 211)], ids=["no_mask", "mask"])
def test_engine_gradients_at_head_dim_256(dtype, causal, mask_shape):
    """D = 256, whose gradients only the engine computes (its choice without a mask, asked for with one): a
    per-KV-head bias, GQA, Nq != Nk."""
    B, H, Hkv, nq, nk = 2, 4, 2, 150, 211
    args = make_inputs(B, H, Hkv, nq, nk, 256, dtype, mask_shape=mask_shape, bias_shape=(B, Hkv, nq, nk))
    if not engine_takes(args[0], args[1], args[4]):
        pytest.skip("the block-sparse engine's backward cannot take this problem here (it needs sm_90a)")
    check(*args, causal=causal, backward=None if mask_shape is None else "engine",
          label=f"{dtype} causal={causal} D=256 mask {mask_shape}")


@needs_gpu
def test_causal_bits_are_the_packed_causal_mask():
    """The engine's causal fold: _causal_bits equals pack_mask of the bottom-right causal mask."""
    from attnlab.dynamic_mask import _causal_bits
    for nq, nk in [(17, 130), (129, 64), (1, 200), (65, 1), (100, 70), (33, 97), (64, 64)]:
        want = attnlab.pack_mask(bottom_right_keep(nq, nk, DEVICE)).bits
        assert torch.equal(_causal_bits(nq, nk, DEVICE), want), (nq, nk)


@needs_gpu
def test_backward_choice():
    """Without a mask the engine where it takes the problem (sm_90a), else and with a mask dmattn's; asking
    for one that cannot run raises."""
    q, k, v, mask, bias, _ = make_inputs(1, 4, 2, 40, 50, 64, torch.float16, mask_shape=(1, 4, 40, 50),
                                         bias_shape=(1, 2, 1, 50))
    path = attnlab.dynamic_mask.backward_path
    engine = engine_takes(q, k)
    assert path(q, k) == ("engine" if engine else "dmattn")
    assert path(q, k, attn_bias=bias) == ("engine" if engine else "dmattn")
    assert path(q, k, attn_mask=mask) == "dmattn"
    if engine:
        assert path(q, k, attn_mask=mask, backward="engine") == "engine"
    assert path(q, k, backward="dmattn") == "dmattn"
    assert path(q, k, attn_bias=bias, softcap=5.0) == "dmattn"  # one score_mod there
    q32, k32, _, _, _, _ = make_inputs(1, 4, 2, 40, 50, 32, torch.float16)
    assert path(q32, k32) == "dmattn"
    with pytest.raises(ValueError, match="backward='engine' cannot take this problem: "):
        attnlab.dynamic_mask_attention(q.requires_grad_(), k, v, attn_bias=bias, softcap=5.0, backward="engine")
    with pytest.raises(ValueError, match="backward must be None, 'dmattn' or 'engine'"):
        attnlab.dynamic_mask_attention(q, k, v, backward="cudnn")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_scale_and_uint8_mask(dtype):
    B, H, Hkv, nq, nk = 1, 4, 1, 50, 80
    q, k, v, mask, bias, dout = make_inputs(B, H, Hkv, nq, nk, 96, dtype, mask_shape=(1, H, nq, nk),
                                            bias_shape=(1, 1, 1, nk))
    check(q, k, v, mask.to(torch.uint8), bias, dout, scale=0.05, label=f"{dtype} scale 0.05, uint8 mask")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fully_masked_rows_give_zero(dtype):
    """Rows whose mask is all zero, and causal rows before the first key (Nq > Nk)."""
    B, H, Hkv, nq, nk = 2, 4, 2, 100, 70
    q, k, v, mask, bias, dout = make_inputs(B, H, Hkv, nq, nk, 64, dtype, mask_shape=(B, H, nq, nk),
                                            bias_shape=(B, Hkv, nq, nk))
    mask[0, 1, 40] = False
    mask[1, :, 77] = False
    out, lse, (dq, dk, dv, dbias) = check(q, k, v, mask, bias, dout, causal=True, label=f"{dtype} masked rows")
    for b, h, i in [(0, 1, 40), (1, 0, 77), (1, 3, 77), (0, 2, 5), (1, 1, 29)]:  # i < 30: causal, no key
        assert torch.all(out[b, h, i] == 0) and torch.all(dq[b, h, i] == 0), (b, h, i)
        assert torch.isneginf(lse[b, h, i]), (b, h, i)
    assert torch.all(dbias[1, :, 77] == 0) and torch.all(dbias[:, :, :30] == 0)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@backwards
@pytest.mark.parametrize("bias_shape", [(1, 2, 1, 300), (2, 2, 200, 300)], ids=["1xHkvx1xNk", "BxHkvxNqxNk"])
def test_deterministic_gradients_are_bitwise_identical(dtype, backward, bias_shape):
    """deterministic=True: three forward+backward runs give the same bits (and the right values); a per-KV-head
    bias, its dBias summed over each group's query heads."""
    B, H, Hkv, nq, nk = 2, 4, 2, 200, 300
    q, k, v, mask, bias, dout = make_inputs(B, H, Hkv, nq, nk, 64, dtype, mask_shape=(B, Hkv, nq, nk),
                                            bias_shape=bias_shape)
    runs = [check(q, k, v, mask, bias, dout, causal=True, deterministic=True, backward=backward,
                  label=f"{dtype} deterministic run {r} {backward}") for r in range(3)]
    for r in (1, 2):
        for name, a, b in zip(["O", "LSE", "dQ", "dK", "dV", "dBias"], [runs[0][0], runs[0][1]] + runs[0][2],
                              [runs[r][0], runs[r][1]] + runs[r][2]):
            assert torch.equal(a, b), f"{dtype} run {r}: {name} differs from run 0 " \
                                      f"(max diff {float((a.float() - b.float()).abs().max()):.3e})"


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_mask_summary_gives_the_same_bits(dtype, causal):
    """build_mask_summary once, then dynamic_mask_attention(mask_summary=...):
    the pass rule, and the same bits as without it (forward and, deterministic,
    every gradient; the backward then reads the given summary)."""
    B, H, Hkv, nq, nk = 2, 4, 2, 200, 300
    q, k, v, mask, bias, dout = make_inputs(B, H, Hkv, nq, nk, 64, dtype, mask_shape=(B, Hkv, nq, nk),
                                            bias_shape=(1, Hkv, 1, nk), keep=0.3)
    mask[:, :, :, 64:192] = False  # two all-zero key tiles: tiles to skip
    summary = attnlab.build_mask_summary(q, k, mask, is_causal=causal)
    assert isinstance(summary, attnlab.MaskSummary) and summary.tensor.dtype == torch.uint8
    given = check(q, k, v, mask, bias, dout, causal=causal, deterministic=True, mask_summary=summary,
                  label=f"{dtype} summary given")
    scanned = check(q, k, v, mask, bias, dout, causal=causal, deterministic=True, label=f"{dtype} scanned")
    for name, a, b in zip(["O", "LSE", "dQ", "dK", "dV", "dBias"], [given[0], given[1]] + given[2],
                          [scanned[0], scanned[1]] + scanned[2]):
        assert torch.equal(a, b), f"{dtype}: {name} with the summary given differs from the scanning run"


@needs_gpu
def test_mask_summary_misuse_raises():
    """A summary used with another mask tensor, after the mask changed in place,
    with other shapes or is_causal, or without a mask: a clear error, never a
    silently wrong answer."""
    q, k, v, mask, bias, _ = make_inputs(1, 2, 1, 100, 150, 64, torch.float16, mask_shape=(1, 1, 100, 150),
                                         bias_shape=(1, 1, 1, 150))
    summary = attnlab.build_mask_summary(q, k, mask, is_causal=True)

    def run(**kw):
        args = dict(attn_mask=mask, attn_bias=bias, is_causal=True, mask_summary=summary)
        args.update(kw)
        return attnlab.dynamic_mask_attention(args.pop("q", q), k, v, **args)

    run()  # the right use works
    with pytest.raises(ValueError, match="another attn_mask"):
        run(attn_mask=mask.clone())
    with pytest.raises(ValueError, match="is_causal"):
        run(is_causal=False)
    with pytest.raises(ValueError, match="shapes"):
        run(q=q[:, :, :50])
    with pytest.raises(ValueError, match="without attn_mask"):
        run(attn_mask=None)
    with pytest.raises(TypeError, match="build_mask_summary"):
        run(mask_summary=summary.tensor)
    mask[0, 0, 0, 0] = ~mask[0, 0, 0, 0]
    with pytest.raises(ValueError, match="modified"):
        run()


def packed_by_torch(mask):
    """pack_mask's words computed with torch ops: rows of 2 * ceil(Nk / 64)
    int32 words, bit j of word w = key 32 w + j, padding 0."""
    nk = mask.shape[-1]
    words = 2 * ((nk + 63) // 64)
    m = torch.zeros(*mask.shape[:-1], words * 32, dtype=torch.int64, device=mask.device)
    m[..., :nk] = mask.long() != 0
    w = (m.view(*mask.shape[:-1], words, 32) << torch.arange(32, device=mask.device)).sum(-1)
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("mask_kind", ["per-kv-head", "query-broadcast", "2-D uint8"])
def test_packed_mask_gives_the_same_bits(dtype, causal, mask_kind):
    """pack_mask once, then dynamic_mask_attention(attn_mask=packed): its words
    as torch packs them, the pass rule, and the same bits as the bool mask
    (forward and, deterministic, every gradient); also with a summary built
    from the packed mask."""
    B, H, Hkv, nq, nk = 2, 4, 2, 150, 333
    shape = {"per-kv-head": (B, Hkv, nq, nk), "query-broadcast": (1, Hkv, 1, nk), "2-D uint8": (nq, nk)}[mask_kind]
    q, k, v, mask, bias, dout = make_inputs(B, H, Hkv, nq, nk, 64, dtype, mask_shape=shape,
                                            bias_shape=(1, Hkv, 1, nk), keep=0.4)
    mask[..., 64:192] = False  # two all-zero key tiles: tiles to skip
    if mask_kind == "2-D uint8":
        mask = mask.to(torch.uint8)
    packed = attnlab.pack_mask(mask)
    mask4 = mask if mask.dim() == 4 else mask[None, None]
    assert isinstance(packed, attnlab.PackedMask) and packed.shape == mask4.shape
    assert torch.equal(packed.bits, packed_by_torch(mask4)), f"{mask_kind}: packed words differ from torch's packing"
    ref_mask = mask4.bool()
    packed_run = check(q, k, v, ref_mask, bias, dout, causal=causal, deterministic=True, ours_mask=packed,
                       label=f"{dtype} {mask_kind} packed")
    byte_run = check(q, k, v, ref_mask, bias, dout, causal=causal, deterministic=True, label=f"{dtype} {mask_kind}")
    summary = attnlab.build_mask_summary(q, k, packed, is_causal=causal)
    given_run = check(q, k, v, ref_mask, bias, dout, causal=causal, deterministic=True, ours_mask=packed,
                      mask_summary=summary, label=f"{dtype} {mask_kind} packed, summary given")
    for other, what in ((packed_run, "the packed mask"), (given_run, "the packed mask's summary given")):
        for name, a, b in zip(["O", "LSE", "dQ", "dK", "dV", "dBias"], [other[0], other[1]] + other[2],
                              [byte_run[0], byte_run[1]] + byte_run[2]):
            assert torch.equal(a, b), f"{dtype} {mask_kind}: {name} with {what} differs from the bool mask's"


@needs_gpu
def test_packed_mask_misuse_raises():
    """A packed mask for another key count, a raw int32 mask (the kernels would
    read it as packed words), a packed mask of a float tensor: clear errors."""
    q, k, v, mask, _, _ = make_inputs(1, 2, 1, 40, 100, 64, torch.float16, mask_shape=(1, 1, 40, 100))
    packed = attnlab.pack_mask(mask)
    dma = attnlab.dynamic_mask_attention
    dma(q, k, v, attn_mask=packed)  # the right use works
    k2, v2 = k[:, :, :90].contiguous(), v[:, :, :90].contiguous()  # 90 keys: the same row words as 100
    with pytest.raises(ValueError, match="packed for 100 keys, k has 90"):
        dma(q, k2, v2, attn_mask=packed)
    with pytest.raises(TypeError, match="must be bool or uint8"):
        dma(q, k, v, attn_mask=packed.bits)
    with pytest.raises(TypeError, match="must be bool or uint8"):
        attnlab.pack_mask(mask.half())
    with pytest.raises(ValueError, match="another attn_mask"):
        dma(q, k, v, attn_mask=attnlab.pack_mask(mask), mask_summary=attnlab.build_mask_summary(q, k, packed))


# ---- as a module inside a model ---------------------------------------------------------
@needs_gpu
def test_drops_into_a_model():
    """Non-contiguous inputs, a 2-D mask and a 1-D bias (leading dims added), no
    grad for a bias that does not require it, and .backward() through a loss."""
    torch.manual_seed(next(_seed))
    B, H, Hkv, nq, nk, d = 2, 4, 2, 40, 90, 64
    x = torch.randn(B, nq, H, d, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(B, nk, 2, Hkv, d, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    q = x.transpose(1, 2)  # [B, H, Nq, D], not contiguous
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    mask = torch.rand(nq, nk, device=DEVICE) < 0.8
    bias = torch.randn(nk, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    out = attnlab.dynamic_mask_attention(q, k, v, attn_mask=mask, attn_bias=bias)
    ref, _ = dense_attention(q.float(), k.float(), v.float(), mask[None, None], bias.float()[None, None, None],
                             False, d ** -0.5, None)
    assert out.shape == (B, H, nq, d) and (out.float() - ref).abs().max() < 3e-2
    out.float().square().sum().backward()
    assert x.grad.shape == x.shape and kv.grad.shape == kv.shape and bias.grad.shape == bias.shape
    assert all(torch.isfinite(g).all() for g in (x.grad, kv.grad, bias.grad))
    # A bias that needs no gradient gets none; under no_grad there is no graph.
    q2 = q.detach().requires_grad_()
    out2 = attnlab.dynamic_mask_attention(q2, k.detach(), v.detach(), attn_bias=bias.detach(), is_causal=True)
    out2.sum().backward()
    assert q2.grad is not None
    with torch.no_grad():
        assert not attnlab.dynamic_mask_attention(q, k, v).requires_grad


@needs_gpu
@pytest.mark.parametrize("d", [192, 256])
def test_forward_only_head_dims(d):
    """D = 192 (and 256 on dmattn's backward): the forward runs without grad; with grad it says the backward cannot."""
    q, k, v, _, _, _ = make_inputs(1, 2, 1, 20, 70, d, torch.float16)
    with torch.no_grad():
        out = attnlab.dynamic_mask_attention(q, k, v, is_causal=True)
    ref, _ = dense_attention(q.float(), k.float(), v.float(), None, None, True, d ** -0.5, None)
    assert (out.float() - ref).abs().max() < 1e-2
    with pytest.raises(ValueError, match=f"no gradient.*backward: head dim {d}"):
        attnlab.dynamic_mask_attention(q.requires_grad_(), k, v, backward="dmattn")


# ---- errors ---------------------------------------------------------------------------------
def test_cpu_tensors_raise_a_clear_error():
    """No GPU needed: the device is checked before anything touches CUDA."""
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="dynamic_mask_attention: q must be a CUDA tensor"):
        attnlab.dynamic_mask_attention(q, q, q)
    with pytest.raises(TypeError, match="must be torch.Tensors"):
        attnlab.dynamic_mask_attention(q, None, q)


@needs_gpu
def test_bad_inputs_raise_clear_errors():
    def t(*shape, dtype=torch.float16):
        return torch.randn(*shape, device=DEVICE).to(dtype)

    q, kv = t(2, 4, 16, 64), t(2, 2, 32, 64)
    dma = attnlab.dynamic_mask_attention
    cases = [
        (TypeError, "float16 or bfloat16", lambda: dma(q.float(), kv.float(), kv.float())),
        (TypeError, "share a dtype", lambda: dma(q, kv.bfloat16(), kv)),
        (ValueError, "4-D", lambda: dma(q[0], kv[0], kv[0])),
        (ValueError, "head dim 48 not in", lambda: dma(t(2, 4, 16, 48), t(2, 2, 32, 48), t(2, 2, 32, 48))),
        (ValueError, "head dim", lambda: dma(q, t(2, 2, 32, 32), t(2, 2, 32, 32))),
        (ValueError, r"must be a multiple of k's and v's \(3\)", lambda: dma(q, t(2, 3, 32, 64), t(2, 3, 32, 64))),
        (ValueError, "share Hkv and Nk", lambda: dma(q, kv, t(2, 2, 31, 64))),
        (ValueError, "share B", lambda: dma(q, t(1, 2, 32, 64), t(1, 2, 32, 64))),
        (TypeError, "mask must be bool or uint8", lambda: dma(q, kv, kv, attn_mask=t(1, 1, 16, 32))),
        (ValueError, r"mask must have shape \(\{2\|1\}, \{4\|2\|1\}, \{16\|1\}, 32\)",
         lambda: dma(q, kv, kv, attn_mask=torch.ones(2, 4, 16, 33, dtype=torch.bool, device=DEVICE))),
        (ValueError, "mask must have shape",
         lambda: dma(q, kv, kv, attn_mask=torch.ones(2, 3, 16, 32, dtype=torch.bool, device=DEVICE))),
        (ValueError, "mask must have shape",
         lambda: dma(q, kv, kv, attn_mask=torch.ones(3, 1, 1, 32, dtype=torch.bool, device=DEVICE))),
        (ValueError, "mask must have 1 to 4 dims",
         lambda: dma(q, kv, kv, attn_mask=torch.ones(1, 2, 4, 16, 32, dtype=torch.bool, device=DEVICE))),
        (TypeError, "bias must have q's dtype", lambda: dma(q, kv, kv, attn_bias=t(2, 2, 1, 32, dtype=torch.float32))),
        (ValueError, "bias must have shape", lambda: dma(q, kv, kv, attn_bias=t(2, 2, 15, 32))),
        (ValueError, "bias must be on q's device", lambda: dma(q, kv, kv, attn_bias=t(2, 2, 1, 32).cpu())),
        (ValueError, "softcap must be >= 0", lambda: dma(q, kv, kv, softcap=-1.0)),
        (ValueError, "scale must be positive", lambda: dma(q, kv, kv, scale=0.0)),
    ]
    for error, pattern, call in cases:
        with pytest.raises(error, match=pattern):
            call()


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_inputs_off_16_byte_boundaries(dtype):
    """q, k, v and the output gradient as contiguous views that start 2 bytes
    past a 16-byte boundary (the kernels copy in 16-byte pieces; the binding
    copies such a tensor to a fresh allocation first): the pass rule, and the
    same bits as the same values in aligned tensors (deterministic)."""
    B, H, Hkv, nq, nk, d = 1, 4, 2, 130, 200, 64
    q, k, v, mask, bias, dout = make_inputs(B, H, Hkv, nq, nk, d, dtype, mask_shape=(B, Hkv, nq, nk),
                                            bias_shape=(1, Hkv, 1, nk))

    def off_by_one_element(t):
        buf = torch.empty(t.numel() + 8, device=DEVICE, dtype=t.dtype)
        view = buf[1:1 + t.numel()].view(t.shape)
        view.copy_(t)
        assert view.is_contiguous() and view.data_ptr() % 16 != 0
        return view

    off = check(*(off_by_one_element(t) for t in (q, k, v)), mask, bias, off_by_one_element(dout), causal=True,
                deterministic=True, label=f"{dtype} off 16 bytes")
    ref = check(q, k, v, mask, bias, dout, causal=True, deterministic=True, label=f"{dtype} aligned")
    for name, a, b in zip(["O", "LSE", "dQ", "dK", "dV", "dBias"], [off[0], off[1]] + off[2],
                          [ref[0], ref[1]] + ref[2]):
        assert torch.equal(a, b), f"{dtype}: {name} from inputs off 16 bytes differs from the aligned run"
