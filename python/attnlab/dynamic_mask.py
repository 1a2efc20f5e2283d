"""Dynamic-mask attention (flash-dmattn semantics) as a torch.autograd.Function.

The kernels are kernels/dmattn/ (forward: dmattn_fwd.cu, backward: dmattn_bwd.cu);
semantics as in kernels/dmattn/dmattn.h and docs/dmattn_forward.md.
"""
import functools

import torch
from torch.autograd.function import once_differentiable

from . import _C
from ._tensors import PackedMask, _as_4d, pack_mask
from .blocksparse import _blocksparse_backward, create_block_mask

__all__ = ["dynamic_mask_attention", "build_mask_summary", "MaskSummary", "pack_mask", "PackedMask", "backward_path"]


def _mask_tensor(attn_mask):
    """The tensor the kernels read for attn_mask: a PackedMask's words, else the mask itself."""
    return attn_mask.bits if isinstance(attn_mask, PackedMask) else attn_mask


class MaskSummary:
    """A mask's 64x64 tile summary (which tiles have any kept pair, which keep
    all), made by build_mask_summary for one mask tensor, one q/k shape and
    one is_causal. Pass it to dynamic_mask_attention(mask_summary=...) when the
    same mask is used more than once (layers or calls sharing it): the forward
    then does not read the whole mask again. It remembers the mask tensor and
    its version counter, so that using it with another mask, or after the mask
    was modified in place, raises instead of giving a wrong answer."""

    def __init__(self, tensor, mask, q_shape, k_shape, is_causal):
        self.tensor = tensor
        self._mask = mask
        self._version = _mask_tensor(mask)._version
        self._key = (tuple(q_shape), tuple(k_shape), bool(is_causal))
        self._engine_block_mask = None  # the block-sparse engine's BlockMask of it (its first engine backward)

    def check(self, attn_mask, q, k, is_causal):
        """Raises ValueError unless this summary was made for exactly these inputs."""
        if attn_mask is None:
            raise ValueError("attnlab.dynamic_mask_attention: mask_summary given without attn_mask")
        if attn_mask is not self._mask:
            raise ValueError("attnlab.dynamic_mask_attention: mask_summary was built for another attn_mask tensor")
        if _mask_tensor(attn_mask)._version != self._version:
            raise ValueError("attnlab.dynamic_mask_attention: attn_mask was modified after its mask_summary was built")
        if (tuple(q.shape), tuple(k.shape), bool(is_causal)) != self._key:
            raise ValueError("attnlab.dynamic_mask_attention: mask_summary was built for other q/k shapes or is_causal "
                             f"{self._key}, got {(tuple(q.shape), tuple(k.shape), bool(is_causal))}")


def build_mask_summary(q, k, attn_mask, is_causal=False):
    """The tile summary of attn_mask for attention of q [B, H, Nq, D] over
    k [B, Hkv, Nk, D] (only their shapes, dtype and device matter), as
    dynamic_mask_attention would compute it on every call; see MaskSummary."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k)) or not isinstance(attn_mask, (torch.Tensor, PackedMask)):
        raise TypeError("attnlab.build_mask_summary: q and k must be torch.Tensors, attn_mask a torch.Tensor or "
                        "an attnlab.PackedMask")
    q, k = q.contiguous(), k.contiguous()
    mask = _kernel_mask(attn_mask, k)
    tensor = _C.dma_build_mask_summary(q, k, k, mask, bool(is_causal))
    return MaskSummary(tensor, attn_mask, q.shape, k.shape, is_causal)


# ---- the backward's choice: kernels/dmattn/'s, or the block-sparse engine's ---------------
BACKWARDS = ("dmattn", "engine")
_ENGINE_BLOCK = 128  # a multiple of the engine backward's tile at every head dim
_FULL_DBIAS_LIMIT = 1 << 30  # bytes of the fp32 [B, H, Nq, Nk] a deterministic broadcast dBias needs there


def _engine_unfit(q, k, bias, softcap, needs_dbias, deterministic):
    """Why the block-sparse engine's backward (kernels/blocksparse/blocksparse_bwd.h)
    cannot take this dmattn problem ('' when it can): its problem checks
    (sm_90a, head dims 64, 128, 256), one score_mod (a bias or a softcap, not
    both), and the full-size dBias a deterministic shared bias needs there
    (broadcast, or per KV head)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    why = _C.blocksparse_bwd_unsupported_reason(B, H, Nq, Nk, D, D, q.dtype == torch.bfloat16, Hkv)
    if why:
        return why
    if softcap and bias is not None:
        return "a softcap with a bias (the engine takes one score_mod)"
    shared = bias is not None and (bias.shape[1] not in (1, H) or
                                   any(bias.shape[d] == 1 and (B, H, Nq)[d] > 1 for d in range(3)))
    if needs_dbias and deterministic and shared and 4 * B * H * Nq * Nk > _FULL_DBIAS_LIMIT:
        return "a deterministic dBias shared by several pairs needs more than 1 GiB in full there"
    return ""


def _check_backward_arg(backward):
    if backward not in (None,) + BACKWARDS:
        raise ValueError(f"attnlab.dynamic_mask_attention: backward must be None, 'dmattn' or 'engine', got "
                         f"{backward!r}")


def _choose_backward(requested, q, k, mask, bias, softcap, needs_dbias, deterministic):
    """The backward a call runs: `requested` if given ("engine" raises where the
    engine cannot), else the engine where there is no mask and it takes the
    problem (1.17-1.44x dmattn's there), else dmattn's: with a mask, dmattn's
    64 x 64 tiles skip pairs that the engine's 128 x 128 blocks compute
    (0.81-1.64x by mask: docs/blocksparse.md, "dmattn on the engine")."""
    _check_backward_arg(requested)
    if requested == "dmattn" or (requested is None and mask is not None):
        return "dmattn"
    why = _engine_unfit(q, k, bias, softcap, needs_dbias, deterministic)
    if requested == "engine" and why:
        raise ValueError(f"attnlab.dynamic_mask_attention: backward='engine' cannot take this problem: {why}")
    return "dmattn" if why else "engine"


def _causal_bits(nq, nk, device):
    """Bottom-right causal as packed words (pack_mask's layout), int32 [1, 1, Nq,
    2·ceil(Nk / 64)]: row i keeps its first clamp(i + Nk − Nq + 1, 0, Nk) keys."""
    words = 2 * ((nk + 63) // 64)
    kept = (torch.arange(nq, device=device) + (nk - nq + 1)).clamp_(0, nk)
    ones = (kept[:, None] - 32 * torch.arange(words, device=device)).clamp_(0, 32)  # low bits set per word
    w = (torch.ones_like(ones) << ones) - 1  # int64, 0 .. 2^32 - 1
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)[None, None]


def _per_query_head(x, H):
    """A [b, Hkv, ...] mask's words (Hkv < H) repeated to the H query heads (the engine's block mask has 1 or H)."""
    return x if x.shape[1] in (1, H) else x.repeat_interleave(H // x.shape[1], dim=1)


@functools.lru_cache(maxsize=64)
def _spec_block_mask(device, nq, nk, is_causal):
    """The engine's BlockMask of no mask (a few KB), made once per shape."""
    return create_block_mask("causal" if is_causal else "none", 1, 1, nq, nk, _ENGINE_BLOCK, device=device)


def _engine_block_mask(mask, q, k, is_causal):
    """The engine's BlockMask of dmattn's mask, is_causal folded in."""
    H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
    if mask is None:
        return _spec_block_mask(q.device, Nq, Nk, bool(is_causal))
    bits = mask if mask.dtype == torch.int32 else _C.dma_pack_mask_bits(mask)
    bits = _per_query_head(bits, H)
    if is_causal:
        bits = bits & _causal_bits(Nq, Nk, q.device)
    packed = PackedMask(bits.contiguous(), (*bits.shape[:3], Nk))
    return create_block_mask(packed, None, None, Nq, Nk, _ENGINE_BLOCK, device=q.device)


def _engine_backward(ctx, q, k, v, out, lse, dout, bias, block_mask, needs_dbias):
    """dq, dk, dv, dbias of dmattn's problem from the block-sparse engine's backward:
    the mask as its tensor mask_mod, the bias (or the softcap) as its score_mod
    (a per-KV-head bias read by each KV head's query heads)."""
    score = "bias" if bias is not None else f"softcap:{ctx.softcap!r}" if ctx.softcap else "none"
    dq, dk, dv, dbias = _blocksparse_backward(q, k, v, out, lse, dout, block_mask.tensors(), block_mask.BLOCK_SIZE,
                                              block_mask.mask_mod, block_mask.mask_bits, None, score, bias,
                                              needs_dbias, ctx.scale, k.shape[1] != q.shape[1], ctx.deterministic)
    return dq, dk, dv, dbias


class DynamicMaskAttention(torch.autograd.Function):
    """The autograd node: forward and backward on contiguous tensors in the
    kernels' layout (dynamic_mask_attention prepares them). The backward is
    kernels/dmattn/'s or the block-sparse engine's (_choose_backward)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, bias, is_causal, scale, softcap, deterministic, mask_summary, backward):
        needs_grad = any(ctx.needs_input_grad[:3]) or ctx.needs_input_grad[4]
        needs_dbias = bias is not None and ctx.needs_input_grad[4]
        # A backward that could not run should fail now, not after the forward.
        route = None
        if needs_grad:
            route = _choose_backward(backward, q, k, mask, bias, softcap, needs_dbias, deterministic)
        given = mask_summary.tensor if mask_summary is not None else None
        # summary: the forward's tile bits (in its workspace: from its mask
        # pre-pass, or its in-kernel scan with one split), or the summary it
        # was given, so that dmattn's backward need not read the mask again.
        out, lse, summary = _C.dma_forward(q, k, v, mask, bias, is_causal, scale, softcap, route == "dmattn", given)
        ctx.save_for_backward(q, k, v, out, lse, mask, bias, summary)
        ctx.is_causal, ctx.scale, ctx.softcap, ctx.deterministic = is_causal, scale, softcap, deterministic
        ctx.route, ctx.mask_summary = route, mask_summary
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):  # grad_lse: lse is not differentiable
        q, k, v, out, lse, mask, bias, summary = ctx.saved_tensors
        needs_dbias = bias is not None and ctx.needs_input_grad[4]
        dout = grad_out.contiguous()
        if ctx.route == "engine":
            # The block mask is built from the mask once per summary (a mask
            # shared by layers), else on every backward.
            given = ctx.mask_summary
            block_mask = given._engine_block_mask if given is not None else None
            if block_mask is None:
                block_mask = _engine_block_mask(mask, q, k, ctx.is_causal)
                if given is not None:
                    given._engine_block_mask = block_mask
            dq, dk, dv, dbias = _engine_backward(ctx, q, k, v, out, lse, dout, bias, block_mask, needs_dbias)
        else:
            dq, dk, dv, dbias = _C.dma_backward(q, k, v, out, lse, dout, mask, bias, ctx.is_causal, ctx.scale,
                                                ctx.softcap, needs_dbias, ctx.deterministic, summary)
        return dq, dk, dv, None, dbias, None, None, None, None, None, None


def backward_path(q, k, attn_mask=None, attn_bias=None, softcap=None, deterministic=False, needs_dbias=True,
                  backward=None):
    """Which backward dynamic_mask_attention runs for these inputs: "engine" (the
    block-sparse engine's, kernels/blocksparse/) or "dmattn" (kernels/dmattn/'s)."""
    bias = _as_4d(attn_bias, "attn_bias")
    return _choose_backward(backward, q, k, attn_mask, bias, softcap, needs_dbias and bias is not None, deterministic)


def _kernel_mask(attn_mask, k):
    """attn_mask as the kernels take it: a bool/uint8 mask with 4 dims, or a
    PackedMask's words (checked against k's key count: its padding would
    otherwise pass for masked keys)."""
    if isinstance(attn_mask, PackedMask):
        nk = k.shape[2] if isinstance(k, torch.Tensor) and k.dim() == 4 else None
        if nk is not None and attn_mask.shape[-1] != nk:
            raise ValueError(f"attnlab.dynamic_mask_attention: attn_mask was packed for {attn_mask.shape[-1]} keys, "
                             f"k has {nk}")
        return attn_mask.bits
    if isinstance(attn_mask, torch.Tensor) and attn_mask.dtype not in (torch.bool, torch.uint8):
        # (the kernels read an int32 mask as packed words: only PackedMask passes one)
        raise TypeError("attnlab.dynamic_mask_attention: attn_mask must be bool or uint8 (0 = masked) or an "
                        f"attnlab.PackedMask, got {attn_mask.dtype}")
    return _as_4d(attn_mask, "attn_mask")


def dynamic_mask_attention(q, k, v, attn_mask=None, attn_bias=None, is_causal=False, scale=None, softcap=None,
                           deterministic=False, return_lse=False, mask_summary=None, backward=None):
    """Attention with an optional boolean mask and additive bias (flash-dmattn
    semantics), differentiable in q, k, v and attn_bias.

        q [B, H, Nq, D];  k, v [B, Hkv, Nk, D]   H % Hkv == 0 (GQA/MQA): query
            head h reads KV head h // (H // Hkv); fp16 or bf16, one dtype, on
            one CUDA device (a contiguous view that starts off a 16-byte
            boundary is copied first: the kernels read 16-byte pieces).
        attn_mask  bool or uint8, True/nonzero = keep, False/0 = masked out,
            or the same packed to bits by pack_mask (PackedMask: an eighth
            of the bytes for the kernels to read; the same results, bit for bit);
        attn_bias  q's dtype;
            each of shape ({B|1}, {H|Hkv|1}, {Nq|1}, Nk) (fewer dims get leading
            1s); a size-1 dim is broadcast without being expanded in memory.

        S = scale * q @ k^T + attn_bias         (scale None: 1/sqrt(D))
        S = softcap * tanh(S / softcap)         (softcap None or 0: off)
        S = -inf where attn_mask is False or, with is_causal, where key j > i + Nk - Nq
            (bottom-right aligned, as FlashAttention)
        out = softmax(S) @ v                    [B, H, Nq, D], q's dtype

    A query row that sees no key gives out = 0 (and LSE = -inf) and contributes
    no gradient. Gradients: q, k, v, and attn_bias in its own (broadcast) shape,
    summed over the dims it is broadcast along; the mask gets none. Double
    backward is not supported. deterministic=True makes the gradients bitwise
    identical run to run (slower). Forward head dims: 32, 64, 96, 128, 192, 256;
    backward: 32, 64, 96, 128 (kernels/dmattn/), and 256 on the block-sparse
    engine (see `backward`) — when an input requires grad, an unsupported
    backward raises already in the forward.

    Non-contiguous inputs are copied with .contiguous() (the kernels read dense
    [B, H, N, D] rows). Wrong device, dtype or shape raise ValueError/TypeError
    with one line saying what is wrong.

    return_lse=True returns (out, lse) with lse [B, H, Nq] float32, the natural
    log of each row's softmax denominator (not differentiable).

    mask_summary: build_mask_summary(q, k, attn_mask, is_causal) made once for
    a mask used more than once; the forward then skips its scan of the whole
    mask (the same output, bit for bit). It must have been made for this very
    attn_mask tensor, unmodified since, and the same shapes and is_causal, or
    this raises ValueError.

    backward: None runs the gradients of a call without attn_mask on the
    block-sparse engine (kernels/blocksparse/: causal as its mask_mod, the
    bias or the softcap as its score_mod) where it takes the problem (an sm_90a
    GPU, head dims 64, 128 and 256, not a softcap with a bias), else, and with
    a mask, on kernels/dmattn/'s backward; "dmattn" or "engine" asks for one
    (the engine takes the mask as its tensor mask_mod; backward_path says
    which runs).
    """
    q, k, v = (t.contiguous() if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError("attnlab.dynamic_mask_attention: q, k and v must be torch.Tensors")
    _check_backward_arg(backward)
    if mask_summary is not None:
        if not isinstance(mask_summary, MaskSummary):
            raise TypeError("attnlab.dynamic_mask_attention: mask_summary must come from attnlab.build_mask_summary")
        mask_summary.check(attn_mask, q, k, is_causal)
    mask = _kernel_mask(attn_mask, k)
    bias = _as_4d(attn_bias, "attn_bias")
    out, lse = DynamicMaskAttention.apply(q, k, v, mask, bias, bool(is_causal),
                                          None if scale is None else float(scale),
                                          None if softcap is None else float(softcap), bool(deterministic),
                                          mask_summary, backward)
    return (out, lse) if return_lse else out
