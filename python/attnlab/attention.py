"""attnlab.attention: differentiable attention on attnlab's kernels, shaped as
torch.nn.functional.scaled_dot_product_attention, so that a model can call it
in its place.

The forward is attnlab.forward's default variant (the highest rung that runs
the shape), the backward the highest backward rung that runs it ("bwd-ws"
before "bwd-mma"; a deterministic one with deterministic=True). Both are
chosen, and a shape neither runs refused, before any work.
"""
import torch
from torch.autograd.function import once_differentiable

from . import _C
from ._variants import _problem, default_variant

__all__ = ["attention", "backward", "backward_variant", "bwd_variants"]


def bwd_variants():
    """Names of every registered backward variant, in ladder order."""
    return list(_C.bwd_variants())


def backward_variant(q, k, v, is_causal=False, enable_gqa=False, deterministic=False):
    """The backward variant attention() runs for these tensors: the highest
    backward rung that supports their shape and dtype on this GPU. With
    deterministic=True only the deterministic ones (gradients bitwise
    identical run to run); otherwise the others first. Raises ValueError
    naming each variant's reason when none runs the shape; returns None for
    inputs that attnlab.forward rejects anyway (it raises its own message)."""
    shape = _problem(q, k, v, is_causal, enable_gqa)
    if shape is None:
        return None
    names = bwd_variants()
    highest_first = list(reversed(names))
    order = [n for n in highest_first if _C.bwd_deterministic(n) == bool(deterministic)]
    if not deterministic:
        order += [n for n in highest_first if _C.bwd_deterministic(n)]
    reasons = {}
    for name in order:
        why = _C.bwd_unsupported_reason(name, *shape)
        if not why:
            return name
        reasons.setdefault(why, []).append(name)
    B, H, Nq, Nk, D, Dv, bf16, causal, Hkv = shape
    heads = f"H={H}" if Hkv == H else f"H={H} Hkv={Hkv}"
    dims = f"D={D}" if Dv == D else f"D={D} Dv={Dv}"
    what = (f"B={B} {heads} Nq={Nq} Nk={Nk} {dims} {'bfloat16' if bf16 else 'float16'}"
            f"{' causal' if causal else ''}")
    kind = "deterministic backward" if deterministic else "backward"
    if not order:
        why = f"no {kind} kernel is registered" if names else "no backward kernel is registered"
    else:
        why = f"no attnlab {kind} kernel supports {what}: " + "; ".join(
            f"{', '.join(ns)}: {reason}" for reason, ns in reasons.items())
    raise ValueError(f"attnlab.attention: {why} (the forward alone runs under torch.no_grad())")


def backward(q, k, v, o, lse, dout, variant=None, is_causal=False, scale=None, enable_gqa=False):
    """dq, dk, dv of L = sum(o * dout), from attnlab.forward's (o, lse) on the
    same q, k, v, is_causal, scale and enable_gqa; variant: a name from
    bwd_variants(), by default backward_variant()'s choice."""
    if variant is None:
        variant = backward_variant(q, k, v, is_causal, enable_gqa) or (bwd_variants() or [""])[-1]
    return _C.backward(q, k, v, o, lse, dout, variant, bool(is_causal), scale, bool(enable_gqa))


class _Attention(torch.autograd.Function):
    """The autograd node, on contiguous tensors (attention() prepares them)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, enable_gqa, fwd_variant, bwd_variant):
        o, lse = _C.forward(q, k, v, fwd_variant, is_causal, scale, enable_gqa)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.enable_gqa, ctx.bwd_variant = is_causal, scale, enable_gqa, bwd_variant
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _C.backward(q, k, v, o, lse, grad_out.contiguous(), ctx.bwd_variant, ctx.is_causal, ctx.scale,
                                 ctx.enable_gqa)
        return dq, dk, dv, None, None, None, None, None


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
              deterministic=False):
    """softmax(scale * query @ key^T) @ value, differentiable in query, key and
    value; the arguments of torch.nn.functional.scaled_dot_product_attention.

        query [B, H, Nq, D], key [B, Hkv, Nk, D], value [B, Hkv, Nk, Dv]: CUDA,
            float16 or bfloat16, one dtype and device. Non-contiguous tensors
            are copied with .contiguous() (the kernels read dense rows).
        attn_mask, dropout_p: SDPA's, accepted only at their defaults (None,
            0.0): a mask goes to attnlab.dynamic_mask_attention.
        is_causal: query i sees key j iff j <= i + Nk - Nq — bottom-right
            aligned as in FlashAttention, which differs from SDPA's top-left
            alignment when Nq != Nk. A row that sees no key gives 0 and no
            gradient.
        scale: None for 1/sqrt(D).
        enable_gqa: as SDPA's: Hkv dividing H, query head h reads KV head
            h // (H // Hkv); without it Hkv must be H.
        deterministic: a backward whose gradients are bitwise identical run to
            run (slower); by default the fastest.

    Returns [B, H, Nq, Dv] in the input dtype. Raises ValueError (TypeError
    for dtypes) with one line when a kernel cannot take the inputs: for the
    backward already in the forward, when any input requires grad. Double
    backward is not supported.
    """
    if attn_mask is not None:
        raise ValueError("attnlab.attention: attn_mask is not supported (attnlab.dynamic_mask_attention takes masks)")
    if dropout_p != 0.0:
        raise ValueError(f"attnlab.attention: dropout_p must be 0.0, got {dropout_p}")
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        raise TypeError("attnlab.attention: query, key and value must be torch.Tensors")
    q, k, v = (t.contiguous() for t in (query, key, value))
    try:
        fwd = default_variant(q, k, v, is_causal, enable_gqa)
    except ValueError as error:
        raise ValueError(str(error).replace("attnlab.forward:", "attnlab.attention:", 1)) from None
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    bwd = backward_variant(q, k, v, is_causal, enable_gqa, deterministic) if needs_grad else None
    return _Attention.apply(q, k, v, bool(is_causal), None if scale is None else float(scale), bool(enable_gqa), fwd,
                            bwd)
