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

A packed batch of sequences of different lengths, as FlashAttention's
flash_attn_varlen_func (differentiable; not yet run on a GPU: ATTNLAB_UNVERIFIED=1):

    out = attnlab.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal=True)

Decoding against a paged KV cache, as flash_attn_with_kvcache with a block table (likewise):

    out = attnlab.decode(q, k_cache, v_cache, block_table, cache_seqlens)
"""
__version__ = "0.1.0"  # the package's version: pyproject.toml reads it from here

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from . import mods
from ._variants import default_variant, variants
from .attention import attention, backward, backward_variant, bwd_variants
from .blocksparse import BlockMask, create_block_mask, flex_attention, kept_pairs
from .dynamic_mask import MaskSummary, PackedMask, build_mask_summary, dynamic_mask_attention, pack_mask
from .varlen import decode, varlen_attention

__all__ = ["__version__", "variants", "forward", "default_variant", "judge", "unsupported_reason", "attention", "backward",
           "backward_variant", "bwd_variants", "bwd_unsupported_reason", "dynamic_mask_attention",
           "build_mask_summary", "MaskSummary", "pack_mask", "PackedMask", "mods", "BlockMask",
           "create_block_mask", "flex_attention", "kept_pairs", "block_mask_invalid", "varlen_attention", "decode"]

judge = _C.judge
block_mask_invalid = _C.block_mask_invalid
unsupported_reason = _C.unsupported_reason
bwd_unsupported_reason = _C.bwd_unsupported_reason


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
