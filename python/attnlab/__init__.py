"""attnlab: attention kernels, one technique per rung, callable on torch tensors.

    import torch, attnlab
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.float16)
    o, lse = attnlab.forward(q, q, q, is_causal=True)

Tensors are [B, H, N, D], contiguous, fp16 or bf16, on one CUDA device; with
enable_gqa=True (as in torch's scaled_dot_product_attention) k and v may have
fewer heads, Hkv dividing H (GQA; MQA with one): query head h reads KV head
h // (H // Hkv).
Causal masks are bottom-right aligned when Nq != Nk (query i sees key j iff
j <= i + Nk - Nq), as in FlashAttention.

Differentiable, in place of torch.nn.functional.scaled_dot_product_attention
(the same arguments; no mask or dropout; causal bottom-right aligned):

    o = attnlab.attention(q, k, v, is_causal=True)   # backward: the fastest backward rung

Dynamic-mask attention (GQA, a broadcast boolean mask and additive bias,
softcap), differentiable, for use inside a model:

    o = attnlab.dynamic_mask_attention(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=True)

A mask shared by many calls can be packed to bits once (an eighth of the
bytes for the kernels to read): attn_mask=attnlab.pack_mask(mask).

Block-sparse attention, as torch.nn.attention.flex_attention, with the
mask_mods and score_mods of attnlab.mods as spec strings (differentiable):

    bm = attnlab.create_block_mask("sliding_window:1024,0", None, None, N, N)
    out = attnlab.flex_attention(q, k, v, block_mask=bm, score_mod="alibi")
"""
__version__ = "0.1.0"  # the package's version: pyproject.toml reads it from here

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from . import mods
from .attention import attention, backward, backward_variant, bwd_variants
from .blocksparse import BlockMask, create_block_mask, flex_attention, kept_pairs
from .dynamic_mask import MaskSummary, PackedMask, build_mask_summary, dynamic_mask_attention, pack_mask

__all__ = ["__version__", "variants", "forward", "default_variant", "judge", "unsupported_reason", "attention", "backward",
           "backward_variant", "bwd_variants", "bwd_unsupported_reason", "dynamic_mask_attention",
           "build_mask_summary", "MaskSummary", "pack_mask", "PackedMask", "mods", "BlockMask",
           "create_block_mask", "flex_attention", "kept_pairs", "block_mask_invalid"]

judge = _C.judge
block_mask_invalid = _C.block_mask_invalid
unsupported_reason = _C.unsupported_reason
bwd_unsupported_reason = _C.bwd_unsupported_reason


def variants():
    """Names of every registered variant, in ladder order."""
    return list(_C.variants())


def forward(q, k, v, variant=None, is_causal=False, scale=None, enable_gqa=False):
    """Attention with one attnlab variant; returns (o [B,H,Nq,Dv], lse [B,H,Nq] fp32).

    q [B, H, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv].
    variant: a name from variants(); by default the highest rung that runs
             this shape on this GPU (e.g. rung 07 for D <= 256 on an H200).
    scale: softmax scale, by default 1/sqrt(D).
    enable_gqa: as torch's scaled_dot_product_attention's. False: k and v
             have q's H heads (ValueError otherwise); True: H a multiple of
             Hkv, and query head h reads KV head h // (H // Hkv).
    LSE is the natural log of each row's softmax denominator (-inf, with o = 0,
    for a row that sees no key).
    Raises ValueError naming what rules every kernel out when none runs the
    shape (e.g. "no attnlab kernel supports D=2048; the largest head dim is 1024").
    """
    if variant is None:
        variant = default_variant(q, k, v, is_causal, enable_gqa)
    return _C.forward(q, k, v, variant, bool(is_causal), scale, bool(enable_gqa))


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
