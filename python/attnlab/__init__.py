"""attnlab: attention kernels, one technique per rung, callable on torch tensors.

    import torch, attnlab
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.float16)
    o, lse = attnlab.forward(q, q, q, is_causal=True)

Tensors are [B, H, N, D], contiguous, fp16 or bf16, on one CUDA device.
Causal masks are bottom-right aligned when Nq != Nk (query i sees key j iff
j <= i + Nk - Nq), as in FlashAttention.

Dynamic-mask attention (GQA, a broadcast boolean mask and additive bias,
softcap), differentiable, for use inside a model:

    o = attnlab.dynamic_mask_attention(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=True)

A mask shared by many calls can be packed to bits once (an eighth of the
bytes for the kernels to read): attn_mask=attnlab.pack_mask(mask).
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from .dynamic_mask import MaskSummary, PackedMask, build_mask_summary, dynamic_mask_attention, pack_mask

__all__ = ["variants", "forward", "default_variant", "judge", "unsupported_reason", "dynamic_mask_attention",
           "build_mask_summary", "MaskSummary", "pack_mask", "PackedMask"]

judge = _C.judge
unsupported_reason = _C.unsupported_reason


def variants():
    """Names of every registered variant, in ladder order."""
    return list(_C.variants())


def forward(q, k, v, variant=None, is_causal=False, scale=None):
    """Attention with one attnlab variant; returns (o [B,H,Nq,Dv], lse [B,H,Nq] fp32).

    variant: a name from variants(); by default the highest rung that runs
             this shape on this GPU (e.g. rung 07 for D <= 256 on an H200).
    scale: softmax scale, by default 1/sqrt(D).
    LSE is the natural log of each row's softmax denominator (-inf, with o = 0,
    for a row that sees no key).
    """
    if variant is None:
        variant = default_variant(q, k, v, is_causal)
    return _C.forward(q, k, v, variant, bool(is_causal), scale)


def default_variant(q, k, v, is_causal=False):
    """The highest rung that supports these tensors' shape and dtype; the last
    rung's name when none does (forward then raises with its reason)."""
    names = variants()
    if q.dim() == 4 and k.dim() == 4 and v.dim() == 4:
        B, H, Nq, D = q.shape
        Nk, Dv = k.shape[2], v.shape[3]
        bf16 = q.dtype == torch.bfloat16
        for name in reversed(names):
            if not _C.unsupported_reason(name, B, H, Nq, Nk, D, Dv, bf16, bool(is_causal)):
                return name
    return names[-1]
