"""GPU tests of the Python API's backward on inputs allocated the ways users
allocate them: attnlab.attention, attnlab.flex_attention and
attnlab.dynamic_mask_attention, each with q, k, v and the upstream gradient
dO made by separate calls (randn, randn_like after the forward, slices of a
larger buffer, .transpose(1, 2) views of [B, N, H, D] tensors, contiguous
views 2 bytes past a 16-byte boundary, a broadcast scalar), over ragged N,
the head dims the backward takes, causal and not, fp16 and bf16, GQA.

Every case judged by the pass rule of test_attention.py (attnlab.judge: each
of O, dQ, dK, dV within 2x torch's same-precision error against an fp64
reference, plus the reference's rounding). The whole set runs twice in this
process, and once more in a fresh one (this file run as a script), because
what it guards against depends on the state that earlier CUDA calls leave
behind, not only on the shape: a backward must never fail, or report
another call's error, for a tensor that torch's SDPA accepts.

    PYTHONPATH=build/python python3 -m pytest tests/python/test_backward_inputs.py -q
    PYTHONPATH=build/python python3 tests/python/test_backward_inputs.py   # the set once, exit 1 on a failure
"""
import itertools
import os
import subprocess
import sys
import zlib

import pytest
import torch

import attnlab
from test_attention import with_grads  # (O, dQ, dK, dV) of a function on fresh leaves

DEVICE = "cuda"
DTYPES = [torch.float16, torch.bfloat16]
LENGTHS = [1, 17, 127, 129, 255, 1000, 1031]
HEAD_DIMS = [(64, 64), (128, 128), (192, 128), (256, 256)]
PATTERNS = ["randn", "randn_like_after_forward", "slices", "transposed", "off_16_bytes", "broadcast_dout"]


# ---- how users allocate ------------------------------------------------------------------
def _slice_of_wider(t):
    """t's values in a [..., d] slice of a [..., d + 24] buffer (not contiguous)."""
    buf = torch.randn(*t.shape[:-1], t.shape[-1] + 24, device=t.device, dtype=t.dtype)
    view = buf[..., 8:8 + t.shape[-1]]
    view.copy_(t)
    return view


def _transposed(t):
    """t's values as a .transpose(1, 2) view of a [B, N, H, D] tensor."""
    bnhd = torch.empty(t.shape[0], t.shape[2], t.shape[1], t.shape[3], device=t.device, dtype=t.dtype)
    view = bnhd.transpose(1, 2)
    view.copy_(t)
    return view


def _off_16_bytes(t):
    """t's values in a contiguous view that starts 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, device=t.device, dtype=t.dtype)
    view = buf[1:1 + t.numel()].view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.data_ptr() % 16 != 0
    return view


def arrange(pattern, t):
    """The tensor t as `pattern` allocates it (the same values)."""
    if pattern == "slices":
        return _slice_of_wider(t)
    if pattern == "transposed":
        return _transposed(t)
    if pattern == "off_16_bytes":
        return _off_16_bytes(t)
    return t


def upstream(pattern, o, made_before):
    """dO for `pattern`: the one drawn before the forward, or made after it from o."""
    if pattern == "randn_like_after_forward":
        return torch.randn_like(o)
    if pattern == "broadcast_dout":
        return torch.full((), 0.75, device=o.device, dtype=o.dtype).expand(o.shape)
    return arrange(pattern, made_before)


# ---- the reference: softmax(scale q kᵀ, masked) v through torch's autograd -----------------
def dense(q, k, v, keep, scale):
    """Unfused attention in q's precision; keep [Nq, Nk] (None: every pair). A
    row that sees no key gives 0 and no gradient."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-2, -1)) * scale
    if keep is None:
        return torch.softmax(s, dim=-1) @ v
    empty = ~keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(empty, 0.0)
    return torch.softmax(s, dim=-1).masked_fill(empty, 0.0) @ v


def judged(ours, q, k, v, dout, keep, scale, label):
    """Each of O, dQ, dK, dV by attnlab.judge against the fp64 reference."""
    dout = dout.contiguous()
    ref = with_grads(lambda *a: dense(*a, keep, scale), q.double(), k.double(), v.double(), dout.double())
    same = with_grads(lambda *a: dense(*a, keep, scale), q, k, v, dout)
    for name, x, r, s in zip(("O", "dQ", "dK", "dV"), ours, ref, same):
        assert x.shape == r.shape and x.dtype == q.dtype, f"{label}: {name} is {x.dtype} {list(x.shape)}"
        finite = torch.isfinite(x)
        bad = int((~finite).sum())
        err = float((x.double() - r).abs()[finite].max()) if finite.any() else 0.0
        baseline = float((s.double() - r).abs().max())
        rounding = float(((r + 0.3).to(q.dtype).double() - 0.3 - r).abs().max())
        ok, tol = attnlab.judge(err, bad, 0.0, 0, baseline, rounding)
        assert ok, f"{label}: {name} err {err:.2e} > tol {tol:.2e} (torch same precision {baseline:.2e}), {bad} nonfinite"


def bottom_right(nq, nk):
    i = torch.arange(nq, device=DEVICE)[:, None]
    j = torch.arange(nk, device=DEVICE)[None, :]
    return j <= i + (nk - nq)


# ---- the cases ------------------------------------------------------------------------------
def attention_cases():
    """(pattern, H, Hkv, Nq, Nk, D, Dv, dtype, causal): every length, head dim,
    dtype and causality once, the patterns and GQA turned through them, Nk != Nq
    in every third case."""
    cases = []
    for n, (i, ((d, dv), dtype, causal)) in itertools.product(
            LENGTHS, enumerate(itertools.product(HEAD_DIMS, DTYPES, [False, True]))):
        index = len(cases)
        pattern = PATTERNS[index % len(PATTERNS)]
        hkv = 2 if index % 4 == 1 else 4
        nk = n + 64 if index % 3 == 2 else n
        cases.append((pattern, 4, hkv, n, nk, d, dv, dtype, causal))
    return cases


def run_attention_case(pattern, H, Hkv, nq, nk, d, dv, dtype, causal, seed):
    """attnlab.attention forward and backward on inputs allocated by `pattern`;
    False where no backward kernel takes the shape."""
    torch.manual_seed(seed)
    q0 = torch.randn(1, H, nq, d, device=DEVICE, dtype=dtype)
    k0 = torch.randn(1, Hkv, nk, d, device=DEVICE, dtype=dtype)
    v0 = torch.randn(1, Hkv, nk, dv, device=DEVICE, dtype=dtype)
    dout0 = torch.randn(1, H, nq, dv, device=DEVICE, dtype=dtype)
    gqa = Hkv != H
    try:
        attnlab.backward_variant(q0, k0, v0, causal, gqa)
    except ValueError:
        return False
    q, k, v = (arrange(pattern, t).requires_grad_(True) for t in (q0, k0, v0))
    o = attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    dout = upstream(pattern, o, dout0)
    ours = (o.detach(), *torch.autograd.grad(o, (q, k, v), dout))
    label = f"{pattern} H={H} Hkv={Hkv} Nq={nq} Nk={nk} D={d} Dv={dv} {dtype} causal={causal}"
    judged(ours, q0, k0, v0, dout, bottom_right(nq, nk) if causal else None, d ** -0.5, label)
    return True


MASKED_LENGTHS = [1, 17, 129, 1000, 1031]


def masked_cases():
    """(pattern, H, Hkv, N, D, dtype): each length and head dim both dtypes, patterns and GQA turned."""
    cases = []
    for n, d, dtype in itertools.product(MASKED_LENGTHS, [64, 128], DTYPES):
        index = len(cases)
        cases.append((PATTERNS[index % len(PATTERNS)], 4, 2 if index % 2 else 4, n, d, dtype))
    return cases


def run_flex_case(pattern, H, Hkv, n, d, dtype, seed):
    """attnlab.flex_attention on the causal mask_mod, backward on `pattern`'s inputs."""
    torch.manual_seed(seed)
    q0 = torch.randn(1, H, n, d, device=DEVICE, dtype=dtype)
    k0 = torch.randn(1, Hkv, n, d, device=DEVICE, dtype=dtype)
    v0 = torch.randn(1, Hkv, n, d, device=DEVICE, dtype=dtype)
    dout0 = torch.randn(1, H, n, d, device=DEVICE, dtype=dtype)
    bm = attnlab.create_block_mask("causal", None, None, n, n)
    q, k, v = (arrange(pattern, t).requires_grad_(True) for t in (q0, k0, v0))
    o = attnlab.flex_attention(q, k, v, block_mask=bm, enable_gqa=Hkv != H)
    dout = upstream(pattern, o, dout0)
    ours = (o.detach(), *torch.autograd.grad(o, (q, k, v), dout))
    judged(ours, q0, k0, v0, dout, bottom_right(n, n), d ** -0.5,
           f"flex_attention {pattern} H={H} Hkv={Hkv} N={n} D={d} {dtype} causal")


def run_dynamic_mask_case(pattern, H, Hkv, n, d, dtype, seed):
    """attnlab.dynamic_mask_attention with a random mask (per KV head, as
    flash-dmattn's) and causal, backward on `pattern`'s inputs."""
    torch.manual_seed(seed)
    q0 = torch.randn(1, H, n, d, device=DEVICE, dtype=dtype)
    k0 = torch.randn(1, Hkv, n, d, device=DEVICE, dtype=dtype)
    v0 = torch.randn(1, Hkv, n, d, device=DEVICE, dtype=dtype)
    dout0 = torch.randn(1, H, n, d, device=DEVICE, dtype=dtype)
    mask = torch.rand(1, 1, n, n, device=DEVICE) < 0.7
    q, k, v = (arrange(pattern, t).requires_grad_(True) for t in (q0, k0, v0))
    o = attnlab.dynamic_mask_attention(q, k, v, attn_mask=mask, is_causal=True)
    dout = upstream(pattern, o, dout0)
    ours = (o.detach(), *torch.autograd.grad(o, (q, k, v), dout))
    judged(ours, q0, k0, v0, dout, mask[0, 0] & bottom_right(n, n), d ** -0.5,
           f"dynamic_mask_attention {pattern} H={H} Hkv={Hkv} N={n} D={d} {dtype} causal, random mask")


def run_set(seeds):
    """Every case once, each on fresh allocations; returns the count that ran."""
    ran = sum(run_attention_case(*c, seed=next(seeds)) for c in attention_cases())
    for c in masked_cases():
        run_flex_case(*c, seed=next(seeds))
        run_dynamic_mask_case(*c, seed=next(seeds))
    torch.cuda.synchronize()
    return ran


# ---- the tests ------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
@pytest.mark.parametrize("case", attention_cases(), ids=lambda c: "-".join(str(x).replace("torch.", "") for x in c))
def test_attention_backward(case):
    if not run_attention_case(*case, seed=zlib.crc32(repr(case).encode())):
        pytest.skip("no backward kernel takes this shape")


@needs_gpu
@pytest.mark.parametrize("case", masked_cases(), ids=lambda c: "-".join(str(x).replace("torch.", "") for x in c))
def test_flex_and_dynamic_mask_backward(case):
    run_flex_case(*case, seed=1)
    run_dynamic_mask_case(*case, seed=2)


@needs_gpu
def test_the_set_twice_in_one_process():
    seeds = itertools.count(90000)
    assert run_set(seeds) > 0
    assert run_set(seeds) > 0


@needs_gpu
def test_the_set_in_a_fresh_process():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@needs_gpu
def test_a_thread_whose_first_cuda_call_is_ours():
    """forward and backward from a fresh thread on tensors made elsewhere,
    torch's allocator already holding every block they take, so that the
    thread's first CUDA call is attnlab's: the tensor maps' encoding needs a
    context current on it (as torch's autograd thread needs, above)."""
    import threading

    q = torch.randn(1, 4, 129, 64, device=DEVICE, dtype=torch.float16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    o, lse = attnlab.forward(q, k, v, is_causal=True)
    dout = torch.randn_like(o)
    main = attnlab.backward(q, k, v, o, lse, dout, is_causal=True)
    torch.cuda.synchronize()
    results, errors = {}, []

    def work():
        try:
            results["forward"] = attnlab.forward(q, k, v, is_causal=True)
            results["backward"] = attnlab.backward(q, k, v, o, lse, dout, is_causal=True)
            torch.cuda.synchronize()
        except Exception as error:  # re-raised in the test's thread below
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, f"in a fresh thread: {errors[0]}"
    assert torch.equal(results["forward"][0], o) and torch.equal(results["forward"][1], lse)
    for name, ours, theirs in zip(("dQ", "dK", "dV"), results["backward"], main):
        assert torch.allclose(ours.float(), theirs.float(), rtol=0, atol=1e-2), f"{name} differs in a fresh thread"


def test_randn_like_gradient_between_forward_and_backward():
    """dO drawn by randn_like between the forward and the backward, at N = 129: the backward then runs on
    torch's autograd thread with every tensor it takes already allocated."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for d, causal in itertools.product([64, 128], [True, False]):
        q = torch.randn(1, 4, 129, d, device=DEVICE, dtype=torch.float16, requires_grad=True)
        k = torch.randn_like(q).requires_grad_()
        v = torch.randn_like(q).requires_grad_()
        o = attnlab.attention(q, k, v, is_causal=causal)
        grads = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
        assert all(torch.isfinite(g).all() for g in grads)


if __name__ == "__main__":
    count = run_set(itertools.count(50000))
    print(f"the backward set: {count} attention cases and {2 * len(masked_cases())} masked ones passed")
