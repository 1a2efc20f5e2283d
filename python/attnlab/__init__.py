"""attnlab: attention kernels, one technique per rung, callable on torch tensors.

    import torch, attnlab
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.float16)
    o, lse = attnlab.forward(q, q, q, is_causal=True)

Tensors are [B, H, N, D], contiguous, fp16 or bf16, on one CUDA device.
Causal masks are bottom-right aligned when Nq != Nk (query i sees key j iff
j <= i + Nk - Nq), as in FlashAttention.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C

__all__ = ["variants", "forward", "judge", "unsupported_reason"]

judge = _C.judge
unsupported_reason = _C.unsupported_reason


def variants():
    """Names of every registered variant, in ladder order."""
    return list(_C.variants())


def forward(q, k, v, variant=None, is_causal=False, scale=None):
    """Attention with one attnlab variant; returns (o [B,H,Nq,Dv], lse [B,H,Nq] fp32).

    variant: a name from variants(); by default the last (highest) rung.
    scale: softmax scale, by default 1/sqrt(D).
    LSE is the natural log of each row's softmax denominator (-inf, with o = 0,
    for a row that sees no key).
    """
    if variant is None:
        variant = variants()[-1]
    return _C.forward(q, k, v, variant, bool(is_causal), scale)
