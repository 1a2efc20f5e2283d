"""attnlab.varlen_attention: attention over a packed batch of sequences of
different lengths, in FlashAttention's varlen layout and calling convention
(flash_attn_varlen_func), on attnlab's Hopper engine (kernels/varlen/).

    q  [total_q, H, D]      sequence b: rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
    k  [total_k, Hkv, D]    sequence b: rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1]
    v  [total_k, Hkv, Dv]
    out [total_q, H, Dv];  lse [H, total_q] fp32 (natural log)

Each sequence is its own attention problem (causal: bottom-right within it);
a sequence may be empty; a row that sees no key gets out = 0, lse = -inf.

Differentiable (the backward at D = 64, 128 and 192/128: rung 14's tiles).

attnlab.decode: the new tokens of each sequence against its paged KV
cache (flash_attn_with_kvcache with a block table), kernels/varlen/paged_decode.cu.
The kernels have not yet run on a GPU: they run only with ATTNLAB_UNVERIFIED=1
in the environment.
"""
import os

import torch
from torch.autograd.function import once_differentiable

from . import _C

__all__ = ["varlen_attention", "decode"]

_NAME = "attnlab.varlen_attention"


def _require_opt_in():
    if os.environ.get("ATTNLAB_UNVERIFIED") != "1":
        raise RuntimeError(f"{_NAME}: the variable-length kernel has not run on a GPU yet; "
                           "set ATTNLAB_UNVERIFIED=1 to run it anyway")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                     scale=None, return_lse=False, check_seqlens=True):
    """Attention per sequence of a packed batch; returns out (and lse with return_lse=True).

    cu_seqlens_q, cu_seqlens_k: int32 [B + 1] on q's device, from 0, non-decreasing,
        ending at total_q / total_k. max_seqlen_q, max_seqlen_k: Python ints at least
        the longest sequence (the host plans with them; nothing reads cu_seqlens on it).
    scale: the softmax scale, by default 1/sqrt(D).
    check_seqlens: copy the offsets to the host and check them before the launch
        (one synchronisation; a malformed offset is then a ValueError). False skips
        it: the kernel then clamps malformed offsets into the tensors (never reads
        or writes past them) but computes attention over whatever rows they name.
    Raises ValueError for shapes, dtypes or offsets no kernel takes (before any
    launch), and, when a gradient is wanted, for shapes the backward does not take.
    """
    _require_opt_in()
    max_seqlen_q, max_seqlen_k, is_causal = int(max_seqlen_q), int(max_seqlen_k), bool(is_causal)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        if q.dim() == 3 and k.dim() == 3 and v.dim() == 3 and cu_seqlens_q.dim() == 1:
            why = _C.varlen_bwd_unsupported_reason(cu_seqlens_q.numel() - 1, q.shape[1], k.shape[1], q.shape[0],
                                                   k.shape[0], q.shape[2], v.shape[2], q.dtype == torch.bfloat16)
            if why:  # refused before the forward runs, not at .backward()
                raise ValueError(f"{_NAME}: no backward for these inputs: {why} "
                                 "(the forward alone runs under torch.no_grad())")
        out, lse = _VarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                                          scale, bool(check_seqlens))
    else:
        out, lse = _C.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                                     scale, bool(check_seqlens))
    return (out, lse) if return_lse else out


class _VarlenAttention(torch.autograd.Function):
    """The forward and its backward (kernels/varlen/varlen_bwd.cu) for autograd; lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, check_seqlens):
        out, lse = _C.varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, check_seqlens)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.shape = (max_q, max_k, is_causal, scale)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, is_causal, scale = ctx.shape
        dq, dk, dv = _C.varlen_backward(q, k, v, out, lse, dout.contiguous(), cu_q, cu_k, max_q, max_k, is_causal,
                                        scale)
        return dq, dk, dv, None, None, None, None, None, None, None


def decode(q, k_cache, v_cache, block_table, cache_seqlens, is_causal=True, scale=None, return_lse=False,
                 check_tables=True):
    """Attention of Nq new tokens per sequence over a paged KV cache; returns out (and lse with return_lse=True).

    q [B, Nq, H, D]; k_cache [num_pages, page_size, Hkv, D], v_cache [.., Dv] (D = Dv = 64, 128 or 256);
    block_table [B, max_pages] int32: sequence b's key j is row j % page_size of page
    block_table[b, j // page_size]; cache_seqlens [B] int32: its keys, the new tokens' own included
    (their K and V already written). Causal: token t sees keys up to cache_seqlens[b] - Nq + t.
    out [B, Nq, H, Dv]; lse [B, H, Nq] fp32. check_tables: copy the table and the lengths to the
    host and check them first (one synchronisation); without it, a page index out of range is
    clamped into the cache. Forward only.
    """
    _require_opt_in()
    out, lse = _C.paged_decode(q, k_cache, v_cache, block_table, cache_seqlens, bool(is_causal), scale,
                               bool(check_tables))
    return (out, lse) if return_lse else out
