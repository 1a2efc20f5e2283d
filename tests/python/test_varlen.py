"""GPU tests of attnlab.varlen_attention (python/attnlab/varlen.py), the
variable-length forward in FlashAttention's varlen layout.

Each sequence of a packed batch against torch's fp64 attention of that
sequence alone, and against the same math in the input precision, judged by
attnlab.judge (the harness's rule): out within 2x the same-precision error
plus twice the reference's rounding, lse within its tolerance, a row that sees
no key out = 0 and lse = -inf exactly. Sequences of length 0 and 1, queries and
keys of different lengths, causal (bottom-right per sequence), GQA, both
dtypes, every head-dim config; the refusals (malformed offsets, shapes) and
the opt-in. The gradients the same way: each of dq, dk, dv of every sequence
against torch's autograd of that sequence alone in fp64 and in the input
precision (dk, dv summed over a KV head's query heads). Runs with
ATTNLAB_UNVERIFIED=1 set here.
"""
import itertools

import pytest
import torch

import attnlab

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

_seed = itertools.count(9100)


@pytest.fixture(autouse=True)
def unverified(monkeypatch):
    monkeypatch.setenv("ATTNLAB_UNVERIFIED", "1")


def offsets(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def reference(q, k, v, causal, scale, dtype):
    """(out, lse) of one sequence: q [Nq, H, D], k, v [Nk, Hkv, *], computed in `dtype` (fp64 or the input's)."""
    nq, nk, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    qh = q.to(dtype).transpose(0, 1)
    kh = k.to(dtype).repeat_interleave(group, 1).transpose(0, 1)
    vh = v.to(dtype).repeat_interleave(group, 1).transpose(0, 1)
    s = (qh @ kh.transpose(-2, -1)).float().double() * scale if dtype == torch.float64 else \
        (qh.float() @ kh.float().transpose(-2, -1)) * scale
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(~(j <= i + (nk - nq)), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    if dtype != torch.float64:
        p = p.to(dtype)
    out = (p.to(vh.dtype) @ vh).float() if dtype != torch.float64 else p @ vh
    return out.transpose(0, 1), lse


def check(lengths_q, lengths_k, H, Hkv, D, Dv, dtype, causal):
    torch.manual_seed(next(_seed))
    tq, tk = sum(lengths_q), sum(lengths_k)
    q = torch.randn(tq, H, D, device="cuda", dtype=dtype)
    k = torch.randn(tk, Hkv, D, device="cuda", dtype=dtype)
    v = torch.randn(tk, Hkv, Dv, device="cuda", dtype=dtype)
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    scale = D ** -0.5
    out, lse = attnlab.varlen_attention(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), is_causal=causal,
                                        return_lse=True)
    assert out.shape == (tq, H, Dv) and lse.shape == (H, tq)
    for b, (nq, nk) in enumerate(zip(lengths_q, lengths_k)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        if nq == 0:
            continue
        got, got_lse = out[q0:q0 + nq].float(), lse[:, q0:q0 + nq]
        if nk == 0:
            assert torch.equal(got, torch.zeros_like(got)), f"sequence {b}: rows without keys must be 0"
            assert torch.all(torch.isneginf(got_lse)), f"sequence {b}: rows without keys must have lse -inf"
            continue
        qs, ks, vs = q[q0:q0 + nq], k[k0:k0 + nk], v[k0:k0 + nk]
        ref, ref_lse = reference(qs, ks, vs, causal, scale, torch.float64)
        low, _ = reference(qs, ks, vs, causal, scale, dtype)
        err = (got.double() - ref).abs().nan_to_num(nan=float("inf")).max().item()
        base = (low.double() - ref).abs().max().item()
        rounding = ((ref + 0.3).to(dtype).double() - 0.3 - ref).abs().max().item()
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(got_lse), ~finite), f"sequence {b}: -inf lse where no key is seen, only"
        lse_err = (got_lse[finite].double() - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        ok, tol = attnlab.judge(err, int((~torch.isfinite(got)).sum()), lse_err, 0, base, rounding)
        assert ok, f"sequence {b} ({nq} x {nk}): err {err:.3e} > {tol:.3e} (lse {lse_err:.2e})"


CONFIGS = [(64, 64), (128, 128), (256, 256), (192, 128), (128, 64)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,Dv", CONFIGS)
def test_ragged_batch(D, Dv, causal, dtype):
    check([1, 17, 0, 300, 129], [1, 17, 0, 300, 129], 4, 2, D, Dv, dtype, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_queries_and_keys_apart(causal):
    check([17, 200, 1, 64, 33], [40, 50, 0, 1, 7], 3, 1, 128, 128, torch.bfloat16, causal)


def test_one_long_among_short():
    check([1000, 1, 3, 130, 127], [1000, 1, 3, 130, 127], 8, 8, 64, 64, torch.float16, True)


def test_refusals():
    q = torch.randn(10, 2, 64, device="cuda", dtype=torch.float16)
    good = offsets([4, 6])
    with pytest.raises(ValueError, match="not the tensor's 10 rows"):
        attnlab.varlen_attention(q, q, q, offsets([4, 5]), offsets([4, 5]), 6, 6)
    with pytest.raises(ValueError, match="decreases"):
        attnlab.varlen_attention(q, q, q, torch.tensor([0, 6, 4, 10], dtype=torch.int32, device="cuda"),
                                 torch.tensor([0, 6, 4, 10], dtype=torch.int32, device="cuda"), 6, 6)
    with pytest.raises(ValueError, match="more than its max_seqlen"):
        attnlab.varlen_attention(q, q, q, good, good, 5, 6)
    with pytest.raises(TypeError, match="int32"):
        attnlab.varlen_attention(q, q, q, good.long(), good, 6, 6)
    with pytest.raises(ValueError, match="head dim|D="):
        x = torch.randn(10, 2, 96, device="cuda", dtype=torch.float16)
        attnlab.varlen_attention(x, x, x, good, good, 6, 6)
    with pytest.raises(ValueError, match="no backward"):
        x = torch.randn(10, 2, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        attnlab.varlen_attention(x, x, x, good, good, 6, 6)


def test_opt_in(monkeypatch):
    monkeypatch.delenv("ATTNLAB_UNVERIFIED")
    q = torch.randn(10, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="ATTNLAB_UNVERIFIED=1"):
        attnlab.varlen_attention(q, q, q, offsets([4, 6]), offsets([4, 6]), 6, 6)


def unfused(q, k, v, causal, scale):
    """One sequence's attention through torch's autograd in the tensors' precision: q [Nq, H, D], k, v [Nk, Hkv, *]."""
    nq, nk, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    qh, kh, vh = q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1), v.repeat_interleave(group, 1).transpose(0, 1)
    s = (qh @ kh.transpose(-2, -1)) * scale
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        keep = j <= i + (nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
        empty = ~keep.any(dim=-1, keepdim=True)
        s = s.masked_fill(empty, 0.0)
        p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    else:
        p = torch.softmax(s, dim=-1)
    return (p @ vh).transpose(0, 1)


def check_gradients(lengths_q, lengths_k, H, Hkv, D, Dv, dtype, causal):
    torch.manual_seed(next(_seed))
    tq, tk = sum(lengths_q), sum(lengths_k)
    q = torch.randn(tq, H, D, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(tk, Hkv, D, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(tk, Hkv, Dv, device="cuda", dtype=dtype, requires_grad=True)
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    scale = D ** -0.5
    out = attnlab.varlen_attention(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), is_causal=causal)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for b, (nq, nk) in enumerate(zip(lengths_q, lengths_k)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        got = {"dq": dq[q0:q0 + nq], "dk": dk[k0:k0 + nk], "dv": dv[k0:k0 + nk]}
        if nq == 0 or nk == 0:  # nothing sees anything: every gradient of the sequence is 0
            for name, g in got.items():
                assert torch.equal(g, torch.zeros_like(g)), f"sequence {b}: {name} must be 0"
            continue
        ins = [t[r0:r0 + n].detach() for t, r0, n in ((q, q0, nq), (k, k0, nk), (v, k0, nk))]
        grads = {}
        for precision in (torch.float64, dtype):
            leaves = [t.to(precision).requires_grad_() for t in ins]
            o = unfused(*leaves, causal, scale)
            grads[precision] = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(o, leaves, dout[q0:q0 + nq].to(precision))))
        for name, g in got.items():
            ref, low = grads[torch.float64][name], grads[dtype][name]
            err = (g.double() - ref).abs().nan_to_num(nan=float("inf")).max().item()
            base = (low.double() - ref).abs().max().item()
            rounding = ((ref + 0.3).to(dtype).double() - 0.3 - ref).abs().max().item()
            ok, tol = attnlab.judge(err, int((~torch.isfinite(g)).sum()), 0.0, 0, base, rounding)
            assert ok, f"sequence {b} ({nq} x {nk}) {name}: err {err:.3e} > {tol:.3e}"


BWD_CONFIGS = [(64, 64), (128, 128), (192, 128)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,Dv", BWD_CONFIGS)
def test_gradients_ragged_batch(D, Dv, causal, dtype):
    check_gradients([1, 17, 0, 300, 129], [1, 17, 0, 300, 129], 4, 2, D, Dv, dtype, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_queries_and_keys_apart(causal):
    check_gradients([17, 200, 1, 64, 33, 0], [40, 50, 0, 1, 7, 9], 3, 1, 128, 128, torch.bfloat16, causal)


# ---- paged decoding ------------------------------------------------------------------

def paged_case(lengths, Nq, H, Hkv, D, page, dtype, causal):
    torch.manual_seed(next(_seed))
    B = len(lengths)
    used = [(n + page - 1) // page for n in lengths]
    pages = sum(used) + 2
    order = torch.randperm(pages).tolist()
    table = torch.full((B, max(used + [1]) + 1), -1, dtype=torch.int32)
    at = 0
    for b, n in enumerate(used):
        table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
        at += n
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype)
    kc = torch.randn(pages, page, Hkv, D, device="cuda", dtype=dtype)
    vc = torch.randn(pages, page, Hkv, D, device="cuda", dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = attnlab.decode(q, kc, vc, table.cuda(), seqlens, is_causal=causal, return_lse=True)
    assert out.shape == (B, Nq, H, D) and lse.shape == (B, H, Nq)
    for b, n in enumerate(lengths):
        if n == 0:
            assert torch.equal(out[b].float(), torch.zeros_like(out[b].float()))
            assert torch.all(torch.isneginf(lse[b]))
            continue
        rows = torch.arange(n)
        idx = table[b, rows // page].long() * page + rows % page
        k = kc.reshape(-1, Hkv, D)[idx.cuda()]
        v = vc.reshape(-1, Hkv, D)[idx.cuda()]
        ref, ref_lse = reference(q[b], k, v, causal, D ** -0.5, torch.float64)
        low, _ = reference(q[b], k, v, causal, D ** -0.5, dtype)
        got = out[b].float()
        err = (got.double() - ref).abs().nan_to_num(nan=float("inf")).max().item()
        base = (low.double() - ref).abs().max().item()
        rounding = ((ref + 0.3).to(dtype).double() - 0.3 - ref).abs().max().item()
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(lse[b]), ~finite)
        lse_err = (lse[b][finite].double() - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        ok, tol = attnlab.judge(err, int((~torch.isfinite(got)).sum()), lse_err, 0, base, rounding)
        assert ok, f"sequence {b} ({n} keys): err {err:.3e} > {tol:.3e} (lse {lse_err:.2e})"


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("Nq", [1, 4, 16])
@pytest.mark.parametrize("page", [16, 256])
def test_paged_decode(D, Nq, page):
    paged_case([1000, 0, 1, 17, 300], Nq, 16, 4, D, page, torch.bfloat16, True)


@pytest.mark.parametrize("causal", [False, True])
def test_paged_decode_odd_pages_and_mqa(causal):
    paged_case([3, 2, 0, 700], 8, 6, 1, 128, 7, torch.float16, causal)


def test_paged_decode_refusals():
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.float16)
    kc = torch.randn(4, 16, 2, 128, device="cuda", dtype=torch.float16)
    table = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="is not a page of the cache"):
        attnlab.decode(q, kc, kc, table, torch.tensor([20, 17], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="outside"):
        attnlab.decode(q, kc, kc, table, torch.tensor([40, 1], dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="int32"):
        attnlab.decode(q, kc, kc, table.long(), torch.tensor([20, 1], dtype=torch.int32, device="cuda"))
