"""The forward's variants: their names, the one attnlab.forward and
attnlab.attention run by default for a problem (default_variant), and the
message that says why none runs it. attnlab/__init__.py and attention.py
both import this module.
"""
import torch

from . import _C

__all__ = ["variants", "default_variant"]


def variants():
    """Names of every registered variant, in ladder order."""
    return list(_C.variants())


# The teaching rung (rung 00: one thread per query row in plain FP32) is slow,
# so the default never picks it.
_SLOW_VARIANTS = ("minimal",)


def default_variant(q, k, v, is_causal=False, enable_gqa=False):
    """The highest rung (not the slow `minimal`) that supports these tensors'
    shape and dtype on this GPU. Raises ValueError naming the fact that rules
    every kernel out when none does. Inputs that forward() rejects anyway
    (not 4-D, mismatched shapes, heads or dtypes) get the highest rung's name,
    so that forward() raises its own message about them."""
    names = variants()
    fast = [n for n in names if n not in _SLOW_VARIANTS]
    shape = _problem(q, k, v, is_causal, enable_gqa)
    if shape is None:
        return fast[-1] if fast else names[-1]
    for name in reversed(fast):
        if not _C.unsupported_reason(name, *shape):
            return name
    raise ValueError("attnlab.forward: " + _no_kernel_message(names, _C.unsupported_reason, *shape))


def _problem(q, k, v, is_causal, enable_gqa=False):
    """(B, H, Nq, Nk, D, Dv, bf16, causal, Hkv) of well-formed inputs, else None."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return None
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16)):
        return None
    B, H, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if k.shape[0] != B or v.shape[:2] != (B, Hkv) or k.shape[3] != D or v.shape[2] != Nk:
        return None
    if min(B, H, Hkv, Nq, Nk, D, Dv) < 1 or H % Hkv != 0 or (Hkv != H and not enable_gqa):
        return None
    return (int(B), int(H), int(Nq), int(Nk), int(D), int(Dv), q.dtype == torch.bfloat16, bool(is_causal),
            int(Hkv))


def _dims_text(dims):
    """Sorted head dims as runs: [8, 16, ..., 512, 576, ..., 1024] ->
    'multiples of 8 up to 512, 576 to 1024 in steps of 64'."""
    parts, i = [], 0
    while i < len(dims):
        j, step = i, 0
        if i + 2 < len(dims) and dims[i + 1] - dims[i] == dims[i + 2] - dims[i + 1]:
            step = dims[i + 1] - dims[i]
            j = i + 2
            while j + 1 < len(dims) and dims[j + 1] - dims[j] == step:
                j += 1
        if step and dims[i] == step:
            parts.append(f"multiples of {step} up to {dims[j]}")
        elif step:
            parts.append(f"{dims[i]} to {dims[j]} in steps of {step}")
        else:
            parts.append(str(dims[i]))
        i = j + 1
    return ", ".join(parts)


def _no_kernel_message(names, unsupported_reason, B, H, Nq, Nk, D, Dv, bf16, causal, Hkv=0):
    """Why no variant in `names` runs the problem, found by asking the registry
    (unsupported_reason(name, B, H, Nq, Nk, D, Dv, bf16, causal, Hkv), '' when
    it runs) about neighbouring problems: the other dtype, the other causal
    flag, other head dims; otherwise each variant's own reason."""
    fast = [n for n in names if n not in _SLOW_VARIANTS]

    def why(n, d=D, dv=Dv, bf=bf16, c=causal):
        return unsupported_reason(n, B, H, Nq, Nk, d, dv, bf, c, Hkv)

    def runs(d=D, dv=Dv, bf=bf16, c=causal):
        return any(not why(n, d, dv, bf, c) for n in fast)

    shape = f"D={D}" if Dv == D else f"D={D} with Dv={Dv}"
    slow = [n for n in names if n in _SLOW_VARIANTS and not why(n)]
    if slow:
        return f"only the slow teaching rung '{slow[0]}' supports {shape} (variant='{slow[0]}' runs it)"
    dtype, other_dtype = ("bfloat16", "float16") if bf16 else ("float16", "bfloat16")
    if runs(bf=not bf16):
        return f"no attnlab kernel supports {dtype} at {shape}; {other_dtype} runs it"
    if runs(c=not causal):
        return f"no attnlab kernel supports {'causal' if causal else 'non-causal'} attention at {shape}"
    square = [d for d in range(1, max(D, 1024) + 1) if runs(d, d)]  # the head dims that run (Dv = D)
    if square and D > square[-1]:
        return f"no attnlab kernel supports D={D}; the largest head dim is {square[-1]}"
    if square and D not in square:
        return f"no attnlab kernel supports D={D}; the head dims are {_dims_text(square)}"
    if square and not runs(D, Dv):
        dvs = [dv for dv in range(1, max(Dv, 1024) + 1) if runs(D, dv)]
        return f"no attnlab kernel supports Dv={Dv} with D={D}; with D={D}, Dv is {_dims_text(dvs)}"
    reasons = {}
    for n in fast:
        reasons.setdefault(why(n), []).append(n)
    heads = f"H={H}" if Hkv in (0, H) else f"H={H} Hkv={Hkv}"
    return (f"no attnlab kernel supports B={B} {heads} Nq={Nq} Nk={Nk} {shape} {dtype}{' causal' if causal else ''}: "
            + "; ".join(f"{', '.join(ns)}: {reason}" for reason, ns in reasons.items()))
