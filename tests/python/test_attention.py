"""GPU tests of attnlab.attention (python/attnlab/attention.py), the
differentiable attention in place of torch's scaled_dot_product_attention.

Gradients against torch's autograd on fp64 copies (the unfused math path,
checked against torch's own math SDPA below), judged as FlashAttention's
tests judge them and as the harness does (attnlab.judge, the same C++ rule):
each of O, dQ, dK, dV within 2x the error of torch's autograd in the input
precision plus twice the rounding error of the reference itself. Odd sizes,
Nq != Nk, GQA and MQA, causal (bottom-right), fp16 and bf16, every backward
variant; shapes no backward kernel takes are skipped with its reason.
"""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not attnlab.bwd_variants(), reason="no backward variant is registered"),
]

DTYPES = [torch.float16, torch.bfloat16]
SIZES = [(1, 1), (17, 17), (127, 127), (1000, 1000), (17, 1000), (1000, 17), (300, 1000)]
HEAD_DIMS = [32, 64, 96, 128, 256]
_seed = itertools.count(7000)


def bottom_right_keep(nq, nk, device):
    """True where query i may see key j: j <= i + nk - nq (FlashAttention's alignment)."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + (nk - nq)


def unfused(q, k, v, causal, scale):
    """softmax(scale q k^T) v through torch's autograd in the tensors' own
    precision (GQA: k, v repeated, so that their gradients sum over a group).
    A row that sees no key gives 0 and no gradient (no NaN: its scores are
    zeroed before the softmax, its probabilities after)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-2, -1)) * scale
    if not causal:
        return torch.softmax(s, dim=-1) @ v
    keep = bottom_right_keep(q.shape[2], k.shape[2], q.device)
    empty = ~keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(empty, 0.0)
    return torch.softmax(s, dim=-1).masked_fill(empty, 0.0) @ v


def with_grads(fn, q, k, v, dout):
    """(O, dQ, dK, dV) of fn on fresh leaves copied from q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(dout)
    return o.detach(), q.grad, k.grad, v.grad


def max_err(x, ref):
    finite = torch.isfinite(x)
    nonfinite = int((~finite).sum())
    err = float((x.double() - ref).abs()[finite].max()) if finite.any() else 0.0
    return err, nonfinite


def rounding_error(ref, dtype):
    return float(((ref + 0.3).to(dtype).double() - 0.3 - ref).abs().max())


def assert_judged(ours, ref, same, dtype, label):
    """Each of O, dQ, dK, dV by the pass rule (attnlab.judge, no LSE here)."""
    for name, x, r, s in zip(("O", "dQ", "dK", "dV"), ours, ref, same):
        assert x.shape == r.shape and x.dtype == dtype, f"{label}: {name} is {x.dtype} {list(x.shape)}"
        baseline, _ = max_err(s, r)
        err, bad = max_err(x, r)
        ok, tol = attnlab.judge(err, bad, 0.0, 0, baseline, rounding_error(r, dtype))
        assert ok, (f"{label}: {name} err {err:.2e} > tol {tol:.2e} (torch same precision {baseline:.2e}), "
                    f"{bad} nonfinite")


def inputs(B, H, Hkv, nq, nk, d, dv, dtype):
    torch.manual_seed(next(_seed))
    q = torch.randn(B, H, nq, d, device="cuda", dtype=dtype)
    k = torch.randn(B, Hkv, nk, d, device="cuda", dtype=dtype)
    v = torch.randn(B, Hkv, nk, dv, device="cuda", dtype=dtype)
    dout = torch.randn(B, H, nq, dv, device="cuda", dtype=dtype)
    return q, k, v, dout


def runs(q, k, v, causal, gqa, deterministic=False):
    """The backward variant attention() would take, or None where none takes the shape."""
    try:
        return attnlab.backward_variant(q, k, v, causal, gqa, deterministic)
    except ValueError:
        return None


def check_case(H, Hkv, nq, nk, d, dv, dtype, causal, deterministic=False):
    """attention()'s O and gradients against the fp64 reference; False when no
    backward kernel takes the shape."""
    B, gqa = 2, Hkv != H
    q, k, v, dout = inputs(B, H, Hkv, nq, nk, d, dv, dtype)
    variant = runs(q, k, v, causal, gqa, deterministic)
    if variant is None:
        return False
    scale = d ** -0.5
    ours = with_grads(lambda q, k, v: attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa,
                                                        deterministic=deterministic), q, k, v, dout)
    torch.cuda.synchronize()
    ref = with_grads(lambda q, k, v: unfused(q, k, v, causal, scale), q.double(), k.double(), v.double(),
                     dout.double())
    same = with_grads(lambda q, k, v: unfused(q, k, v, causal, scale), q, k, v, dout)
    label = f"{variant} H={H} Hkv={Hkv} Nq={nq} Nk={nk} D={d} Dv={dv} {dtype} causal={causal}"
    assert_judged(ours, ref, same, dtype, label)
    if causal and nq > nk:  # rows that see no key: dQ exactly 0
        assert torch.all(ours[1][:, :, : nq - nk] == 0), f"{label}: dQ of rows that see no key"
    return True


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_gradients_match_fp64_autograd(dtype, causal, d):
    ran = [check_case(3, 3, nq, nk, d, d, dtype, causal) for nq, nk in SIZES]
    if not any(ran):
        pytest.skip(f"no backward kernel takes D={d} {dtype} causal={causal}")


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gqa_gradients_sum_over_the_group(heads, causal, d):
    H, Hkv = heads
    ran = [check_case(H, Hkv, nq, nk, d, d, DTYPES[i % 2], causal)
           for i, (nq, nk) in enumerate([(17, 1000), (129, 300), (300, 129), (1, 17)])]
    if not any(ran):
        pytest.skip(f"no backward kernel takes H={H} Hkv={Hkv} D={d} causal={causal}")


@pytest.mark.parametrize("dims", [(192, 128), (128, 64)], ids=["192-128", "128-64"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_head_dims_differ(dims, dtype, causal):
    d, dv = dims
    ran = [check_case(4, hkv, nq, nk, d, dv, dtype, causal) for hkv in (4, 2) for nq, nk in [(129, 300), (300, 129)]]
    if not any(ran):
        pytest.skip(f"no backward kernel takes D={d} Dv={dv}")


@pytest.mark.parametrize("variant", attnlab.bwd_variants())
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_every_backward_variant(variant, dtype, causal):
    """Each backward variant by name (attnlab.backward), not only the one attention() picks."""
    for H, Hkv, nq, nk, d in [(3, 3, 129, 129, 64), (4, 2, 300, 1000, 128), (2, 1, 1000, 300, 64), (3, 3, 17, 17, 128),
                              (4, 2, 129, 300, 256)]:
        bf16 = dtype == torch.bfloat16
        if attnlab.bwd_unsupported_reason(variant, 2, H, nq, nk, d, d, bf16, causal, Hkv):
            continue
        q, k, v, dout = inputs(2, H, Hkv, nq, nk, d, d, dtype)
        gqa, scale = Hkv != H, d ** -0.5
        o, lse = attnlab.forward(q, k, v, is_causal=causal, enable_gqa=gqa)
        dq, dk, dv = attnlab.backward(q, k, v, o, lse, dout, variant=variant, is_causal=causal, enable_gqa=gqa)
        torch.cuda.synchronize()
        ref = with_grads(lambda q, k, v: unfused(q, k, v, causal, scale), q.double(), k.double(), v.double(),
                         dout.double())
        same = with_grads(lambda q, k, v: unfused(q, k, v, causal, scale), q, k, v, dout)
        assert_judged((o, dq, dk, dv), ref, same, dtype, f"{variant} H={H} Hkv={Hkv} Nq={nq} Nk={nk} D={d}")
        if attnlab._C.bwd_deterministic(variant):
            again = attnlab.backward(q, k, v, o, lse, dout, variant=variant, is_causal=causal, enable_gqa=gqa)
            assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), again)), f"{variant}: not bitwise repeatable"
        return
    pytest.skip(f"{variant} takes none of the shapes")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_deterministic_is_bitwise_repeatable(dtype):
    q, k, v, dout = inputs(2, 4, 2, 1000, 1000, 128, 128, dtype)
    if runs(q, k, v, True, True, deterministic=True) is None:
        pytest.skip("no deterministic backward kernel takes the shape")
    first = with_grads(lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, enable_gqa=True,
                                                         deterministic=True), q, k, v, dout)
    for _ in range(4):
        again = with_grads(lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, enable_gqa=True,
                                                             deterministic=True), q, k, v, dout)
        assert all(torch.equal(a, b) for a, b in zip(first[1:], again[1:]))
    assert check_case(4, 2, 1000, 1000, 128, 128, dtype, True, deterministic=True)


def test_reference_agrees_with_torch_math_sdpa():
    """The fp64 reference is torch's math SDPA (forward and gradients) where torch's causal flag agrees (Nq == Nk),
    and with an explicit bottom-right mask where it does not (every row sees a key)."""
    torch.manual_seed(11)
    for causal, (nq, nk) in [(False, (77, 77)), (True, (77, 77)), (False, (40, 90)), (True, (40, 90))]:
        q, k, v, dout = (torch.randn(1, 2, n, 64, device="cuda", dtype=torch.float64) for n in (nq, nk, nk, nq))
        ours = with_grads(lambda q, k, v: unfused(q, k, v, causal, 64 ** -0.5), q, k, v, dout)
        mask = bottom_right_keep(nq, nk, q.device) if causal and nq != nk else None
        with sdpa_kernel(SDPBackend.MATH):
            theirs = with_grads(lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal and nq == nk), q, k, v, dout)
        for a, b in zip(ours, theirs):
            assert (a - b).abs().max() < 1e-10


def test_swaps_for_scaled_dot_product_attention():
    """A model's call site: [B, N, H, D] projections viewed as [B, H, N, D]
    (not contiguous), SDPA's positional arguments; the same output and
    gradients as SDPA up to the rule, where the causal alignments agree."""
    torch.manual_seed(12)
    B, N, H, D = 2, 257, 4, 64
    x = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    if runs(q.contiguous(), k.contiguous(), v.contiguous(), True, False) is None:
        pytest.skip("no backward kernel takes the shape")
    dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    ours = with_grads(lambda q, k, v: attnlab.attention(q, k, v, None, 0.0, True), q, k, v, dout)
    sdpa = with_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, None, 0.0, True), q, k, v, dout)
    ref = with_grads(lambda q, k, v: unfused(q, k, v, True, D ** -0.5), q.double(), k.double(), v.double(),
                     dout.double())
    same = with_grads(lambda q, k, v: unfused(q, k, v, True, D ** -0.5), q, k, v, dout)
    assert_judged(ours, ref, same, torch.bfloat16, "attention in place of SDPA")
    for name, a, b in zip(("O", "dQ", "dK", "dV"), ours, sdpa):  # SDPA's own rounding: a loose sanity bound
        assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max() + 0.02, name


def test_without_grad_runs_the_forward_alone():
    q = torch.randn(1, 2, 33, 64, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        o = attnlab.attention(q, q, q, is_causal=True)
    o_fwd, _ = attnlab.forward(q, q, q, is_causal=True)
    assert torch.equal(o, o_fwd)
    # A shape the forward takes and no backward does: refused in the forward when a gradient is wanted.
    for d in (512, 1024, 320, 768):
        x = torch.randn(1, 1, 16, d, device="cuda", dtype=torch.float16)
        try:
            attnlab.default_variant(x, x, x)
        except ValueError:
            continue
        if runs(x, x, x, False, False) is not None:
            continue
        with torch.no_grad():
            attnlab.attention(x, x, x)
        with pytest.raises(ValueError, match="attnlab.attention: no attnlab backward kernel supports"):
            attnlab.attention(x.requires_grad_(True), x, x)
        break


def test_bad_inputs_raise_clear_errors():
    q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        attnlab.attention(q, q, q, attn_mask=torch.ones(16, 16, device="cuda", dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        attnlab.attention(q, q, q, dropout_p=0.1)
    with pytest.raises(TypeError, match="must be torch.Tensors"):
        attnlab.attention(q, q, None)
    with pytest.raises(ValueError, match="unless enable_gqa=True"):
        k = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
        attnlab.attention(torch.randn(1, 4, 16, 64, device="cuda", dtype=torch.float16), k, k)
    x = q.detach()
    o, lse = attnlab.forward(x, x, x)
    with pytest.raises(ValueError, match="unknown backward variant"):
        attnlab.backward(x, x, x, o, lse, o, variant="no-such-variant")
    variant = attnlab.bwd_variants()[0]  # named: the inputs are checked before the variant's shapes
    with pytest.raises(ValueError, match="lse must be a contiguous float32"):
        attnlab.backward(x, x, x, o, lse.half(), o, variant=variant)
    with pytest.raises(ValueError, match="dout must be a contiguous"):
        attnlab.backward(x, x, x, o, lse, o[:, :, :8], variant=variant)
    with pytest.raises(ValueError, match="unknown backward variant"):
        attnlab.bwd_unsupported_reason("no-such-variant", 1, 1, 16, 16, 64, 64, False, False)
