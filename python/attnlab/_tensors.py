"""The tensors that both attnlab.dynamic_mask_attention and attnlab's
block-sparse attention take: a boolean mask packed to bits (PackedMask,
pack_mask) and the rule that gives a mask or a bias its 4 dims.
dynamic_mask.py and blocksparse.py both import this module; dynamic_mask.py
also imports blocksparse.py (its backward may run on the block-sparse
engine), and nothing imports the other way.
"""
import torch

from . import _C

__all__ = ["PackedMask", "pack_mask"]


class PackedMask:
    """A boolean mask packed to one bit per (query, key) by pack_mask: an
    eighth of the bytes of a bool/uint8 mask, so the kernels' scan of it (all
    of it, on every call) reads an eighth as much. Pass it as attn_mask; it
    has the original mask's shape (`shape`) and broadcasts the same way.
    `bits` holds the words (int32, rows of 2 * ceil(Nk / 64) words, bit
    k % 32 of word k // 32 = key k). Pack once and reuse it for every layer and
    call that shares the mask; it is a copy, so changing the original mask
    afterwards does not change it."""

    def __init__(self, bits, shape):
        self.bits = bits
        self.shape = torch.Size(shape)

    def __repr__(self):
        return f"attnlab.PackedMask(shape={list(self.shape)}, device={self.bits.device})"


def pack_mask(attn_mask):
    """attn_mask (bool or uint8, True/nonzero = keep; 1 to 4 dims, as
    dynamic_mask_attention takes it) as a PackedMask."""
    mask = _as_4d(attn_mask, "attn_mask")
    return PackedMask(_C.dma_pack_mask_bits(mask), mask.shape)


def _as_4d(x, name, where="attnlab.dynamic_mask_attention"):
    """A mask or bias with fewer than 4 dims gets leading size-1 dims (torch's
    broadcasting rule); the kernels read it contiguous in its own shape.
    dynamic_mask_attention's mask and bias, attnlab.flex_attention's tensor mods."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor or None, got {type(x).__name__}")
    if not 1 <= x.dim() <= 4:
        raise ValueError(f"{where}: {name} must have 1 to 4 dims, got shape {list(x.shape)}")
    while x.dim() < 4:
        x = x.unsqueeze(0)
    return x.contiguous()
