"""Block-sparse attention on attnlab's kernels (kernels/blocksparse/,
docs/blocksparse.md), shaped as torch.nn.attention.flex_attention:

    bm = attnlab.create_block_mask("causal", B, H, N, N)            # built on the GPU
    out = attnlab.flex_attention(q, k, v, block_mask=bm, score_mod="alibi")

mask_mods and score_mods are spec strings of attnlab.mods (the kernels'
compile-time functors: a Python callable cannot run in them): "causal",
"sliding_window:128,0", "document" (with doc_ids), ...; "rel_bias", "alibi",
"softcap:30". A tensor is a mask_mod or a score_mod too, as a closure over
one would be in torch: a boolean keep mask (or attnlab.pack_mask's bits) and
an additive bias, each [1|B, 1|H, 1|Q_LEN, KV_LEN] (dmattn's):

    bm = attnlab.create_block_mask(keep, B, H, N, N)                # keep: bool [B, H, N, N]
    out = attnlab.flex_attention(q, k, v, block_mask=bm, score_mod=bias)   # bias.grad too

A torch BlockMask (torch's create_block_mask) converts with
BlockMask.from_torch(bm, mask_mod=spec or tensor).

flex_attention is differentiable: its backward (kernels/blocksparse/
blocksparse_bwd.h) walks the block mask's transposed lists, and is bitwise
deterministic when torch.use_deterministic_algorithms(True) is on.
"""
import torch
from torch.autograd.function import once_differentiable

from . import _C
from ._tensors import PackedMask, _as_4d
from .mods import parse_score_spec

__all__ = ["BlockMask", "create_block_mask", "flex_attention", "kept_pairs"]

# torch's BlockMask fields, in its as_tuple() order.
FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")


def _block_size(BLOCK_SIZE, where):
    sizes = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    if len(sizes) != 2 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"{where}: BLOCK_SIZE must be an int or (Q, KV) ints >= 1, got {BLOCK_SIZE!r}")
    return sizes


def _cuda_device(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _doc_ids(doc_ids, B, device, where):
    """doc_ids as the kernels read them: int32 [B, N] on `device`; a 1-D [N] or
    a [1, N] tensor is the same ids for every batch."""
    if doc_ids is None:
        return None
    if not isinstance(doc_ids, torch.Tensor):
        raise TypeError(f"{where}: doc_ids must be a torch.Tensor (int32 [B, N]), got {type(doc_ids).__name__}")
    if doc_ids.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{where}: doc_ids must be integers (int32 [B, N]), got {doc_ids.dtype}")
    ids = doc_ids.to(device=device, dtype=torch.int32)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() == 2 and ids.shape[0] == 1 and B > 1:
        ids = ids.expand(B, -1)
    return ids.contiguous()


def _check_broadcast(shape, full, name, where):
    """ValueError unless each dim of the 4-D `shape` is 1 or `full`'s."""
    if any(n != 1 and n != f for n, f in zip(shape[:3], full[:3])) or shape[3] != full[3]:
        raise ValueError(f"{where}: {name} of shape {list(shape)} does not broadcast to [B, H, Q_LEN, KV_LEN] = "
                         f"{list(full)} (each of its first 3 dims 1 or the full size, the last KV_LEN)")


def is_tensor_mask(mask_mod):
    """Whether mask_mod is a tensor mask (a tensor or an attnlab.PackedMask)."""
    return isinstance(mask_mod, (torch.Tensor, PackedMask))


def _mask_bits(mask, B, H, Q_LEN, KV_LEN, device, where):
    """A tensor mask_mod as the kernels read it: bit-packed int32 words
    [1|B, 1|H, 1|Q_LEN, 2·ceil(KV_LEN / 64)] (attnlab.pack_mask's) on
    `device`. mask: bool or uint8 (nonzero = keep), 1 to 4 dims broadcasting
    to [B, H, Q_LEN, KV_LEN], or a PackedMask of such a mask."""
    if isinstance(mask, PackedMask):  # (pack_mask made both 4-D)
        shape, bits = tuple(mask.shape), mask.bits
    else:
        if mask.dtype not in (torch.bool, torch.uint8):
            raise TypeError(f"{where}: a tensor mask_mod must be bool or uint8 (nonzero = keep), got {mask.dtype}")
        mask = _as_4d(mask, "mask_mod", where)
        shape, bits = tuple(mask.shape), None
    _check_broadcast(shape, (B, H, Q_LEN, KV_LEN), "mask_mod", where)
    if bits is None:
        if not mask.is_cuda or mask.device != device:
            raise ValueError(f"{where}: the mask_mod tensor must be on {device}, got one on {mask.device}")
        bits = _C.dma_pack_mask_bits(mask.contiguous())
    elif bits.device != device:
        raise ValueError(f"{where}: the PackedMask must be on {device}, got one on {bits.device}")
    return bits.contiguous()


class BlockMask:
    """A block mask (block_mask.h's format) in torch's BlockMask fields:
    int32 tensors kv_num_blocks [B, H, M] and kv_indices [B, H, M, N] (the
    partial key blocks of each query block: the mask_mod runs there),
    full_kv_num_blocks, full_kv_indices (the full ones: the score_mod alone),
    and their transposes q_num_blocks [B, H, N], q_indices [B, H, N, M],
    full_q_num_blocks, full_q_indices (the backward's); M = ceil(Q_LEN /
    BLOCK_SIZE[0]), N = ceil(KV_LEN / BLOCK_SIZE[1]); B and H the problem's or
    1 (broadcast). Indices ascend; the slots past a count are 0. BLOCK_SIZE =
    (Q, KV), seq_lengths = (Q_LEN, KV_LEN), mask_mod its spec (canonical;
    "tensor" for a tensor mask), doc_ids the document mask_mod's ids,
    mask_bits a tensor mask's bit-packed words (else None).

    Boundary rule: a ragged last block whose in-bounds pairs are all kept is
    full here; torch's create_block_mask pads with False and calls it partial
    (from_torch keeps torch's call: both are valid, partial only costs the
    mask_mod)."""

    def __init__(self, tensors, BLOCK_SIZE, seq_lengths, mask_mod, doc_ids=None, mask_bits=None):
        for name, t in zip(FIELDS, tensors):
            setattr(self, name, t)
        self.BLOCK_SIZE = tuple(BLOCK_SIZE)
        self.seq_lengths = tuple(seq_lengths)
        self.mask_mod = mask_mod
        self.doc_ids = doc_ids
        self.mask_bits = mask_bits

    def tensors(self):
        """The 8 tensors, in FIELDS order."""
        return [getattr(self, name) for name in FIELDS]

    def as_tuple(self):
        """torch's BlockMask.as_tuple() order: (Q_LEN, KV_LEN, the 8 tensors, Q block, KV block, mask_mod)."""
        return (*self.seq_lengths, *self.tensors(), *self.BLOCK_SIZE, self.mask_mod)

    @property
    def shape(self):
        return tuple(self.kv_num_blocks.shape[:2]) + self.seq_lengths

    @property
    def device(self):
        return self.kv_num_blocks.device

    def kinds(self):
        """int8 [B, H, M, N]: 0 where the key block is empty for the query
        block, 1 partial, 2 full."""
        B, H, M, N = self.kv_indices.shape
        dense = torch.zeros(B, H, M, N + 1, dtype=torch.int8, device=self.device)
        column = torch.arange(N, device=self.device)
        for kind, count, index in ((1, self.kv_num_blocks, self.kv_indices),
                                   (2, self.full_kv_num_blocks, self.full_kv_indices)):
            listed = column < count[..., None]
            dense.scatter_(-1, torch.where(listed, index, N).long(), kind)
        return dense[..., :N]

    def sparsity(self):
        """The percentage of blocks that are empty (never visited), as torch's."""
        total = self.kv_indices.shape[0] * self.kv_indices.shape[1] * self.kv_indices.shape[2] * self.kv_indices.shape[3]
        visited = int(self.kv_num_blocks.sum()) + int(self.full_kv_num_blocks.sum())
        return 100.0 * (1.0 - visited / total)

    def __repr__(self):
        return (f"attnlab.BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, mask_mod='{self.mask_mod}', "
                f"sparsity={self.sparsity():.2f}%)")

    @classmethod
    def from_torch(cls, bm, mask_mod=None, doc_ids=None):
        """The block mask of a torch BlockMask (torch.nn.attention.flex_attention's),
        or of its as_tuple() (with or without the leading seq_lengths), for
        attnlab.flex_attention. mask_mod: the built-in spec (attnlab.mods) of the
        mask_mod torch's was made from, or the keep tensor its closure read
        (as create_block_mask takes one); needed when there are partial
        blocks, whose mask_mod the kernel evaluates (a torch callable cannot
        run in it). Torch's indices past each count are arbitrary: they are zeroed.
        Raises ValueError with one line when the lists are not a valid block
        mask (attnlab's block_mask_invalid says why)."""
        where = "attnlab.BlockMask.from_torch"
        if isinstance(bm, (tuple, list)):
            # (Q_LEN, KV_LEN,) 8 tensors, [fields of newer torch,] Q block, KV block, mask_mod
            fields = list(bm)
            with_lengths = len(fields) >= 2 and all(isinstance(f, int) for f in fields[:2])
            rest = fields[2:] if with_lengths else fields
            if len(rest) < 11 or not all(isinstance(f, int) for f in rest[-3:-1]):
                raise ValueError(f"{where}: expected a torch BlockMask or its as_tuple(), got a tuple of "
                                 f"{len(fields)} fields")
            tensors, block = rest[:8], rest[-3:-1]
            seq_lengths = (fields[:2] if with_lengths else  # older torch: the lengths the blocks cover
                           [tensors[1].shape[-2] * block[0], tensors[5].shape[-2] * block[1]])
        else:
            try:
                seq_lengths, block = bm.seq_lengths, bm.BLOCK_SIZE
                tensors = [getattr(bm, name) for name in FIELDS]
            except AttributeError as error:
                raise TypeError(f"{where}: expected a torch BlockMask, got {type(bm).__name__} ({error})") from None
        Q_LEN, KV_LEN = (int(n) for n in seq_lengths)
        block_q, block_kv = _block_size(tuple(int(b) for b in block), where)
        if tensors[0] is None or tensors[1] is None or tensors[4] is None or tensors[5] is None:
            raise ValueError(f"{where}: the block mask has no kv_num_blocks/kv_indices or q_num_blocks/q_indices")
        device = tensors[0].device
        M, N = -(-Q_LEN // block_q), -(-KV_LEN // block_kv)
        lists = []
        for i in range(0, 8, 2):
            count, index = tensors[i], tensors[i + 1]
            if count is None:  # torch without separate full blocks: none are full
                count = torch.zeros_like(lists[i - 2])
                index = torch.zeros_like(lists[i - 1])
            count = count.to(device=device, dtype=torch.int32)
            index = index.to(device=device, dtype=torch.int32)
            width = N if i < 4 else M
            if index.shape[-1] > width:  # (a count past the width stays, for the check to report)
                index = index[..., :width]
            elif index.shape[-1] < width:  # compact indices: the slots past them are unused
                index = torch.nn.functional.pad(index, (0, width - index.shape[-1]))
            listed = torch.arange(width, device=device) < count[..., None]
            lists += [count.contiguous(), torch.where(listed, index, 0).contiguous()]
        has_partial = bool((lists[0] > 0).any())
        if mask_mod is None and has_partial:
            raise ValueError(f"{where}: the block mask has partial blocks, where the kernel evaluates the mask_mod: "
                             "pass mask_mod= its built-in spec (e.g. 'causal'; a torch callable cannot run in the "
                             "kernel)")
        spec = mask_mod if mask_mod is not None else "none"
        bits = None
        if is_tensor_mask(spec):
            bits = _mask_bits(spec, int(lists[0].shape[0]), int(lists[0].shape[1]), Q_LEN, KV_LEN, device, where)
            spec = "tensor"
        elif spec == "tensor":
            raise ValueError(f"{where}: the tensor mask_mod is a keep tensor: pass the tensor itself as mask_mod")
        elif callable(spec):
            raise TypeError(f"{where}: mask_mod must be a spec string such as 'causal' (attnlab.mods), not a "
                            "callable")
        try:
            spec = _C.parse_mask_mod(spec, Q_LEN, KV_LEN)
            why = _C.block_mask_invalid(lists, Q_LEN, KV_LEN, block_q, block_kv)
        except ValueError as error:
            raise ValueError(f"{where}: {str(error).split(': ', 1)[-1]}") from None
        if why:
            raise ValueError(f"{where}: not a valid block mask for Q_LEN={Q_LEN}, KV_LEN={KV_LEN}, "
                             f"BLOCK_SIZE=({block_q}, {block_kv}): {why}")
        ids = _doc_ids(doc_ids, int(lists[0].shape[0]), device, where)
        if spec == "document" and ids is None:
            raise ValueError(f"{where}: the document mask_mod needs doc_ids (int32 [B, N])")
        return cls(lists, (block_q, block_kv), (Q_LEN, KV_LEN), spec, ids, bits)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128, device="cuda", doc_ids=None):
    """The block mask of `mask_mod` (a spec of attnlab.mods: "causal",
    "sliding_window:128,0", "document", ...; or a keep tensor, bool or uint8
    [1|B, 1|H, 1|Q_LEN, KV_LEN] (fewer dims: leading 1s), or an
    attnlab.PackedMask of one) for (B, H, Q_LEN, KV_LEN), every pair of every
    block evaluated on the GPU (build_block_mask_from_mod), as torch's
    create_block_mask. B or H None: 1, broadcast over the problem's (a
    tensor's: the tensor's); a tensor's block mask takes the tensor's B and H
    (1 where it broadcasts).
    BLOCK_SIZE: an int or (Q, KV); the forward takes multiples of its tile
    (128 x 128; 128 x 64 at D = 256). doc_ids: the document mask_mod's ids,
    int32 [B, N] (or [N], the same for every batch), N >= max(Q_LEN, KV_LEN),
    the same ids for queries and keys. Returns an attnlab.BlockMask; raises
    ValueError with one line on a bad spec or shape."""
    where = "attnlab.create_block_mask"
    if is_tensor_mask(mask_mod):
        dims = tuple(mask_mod.shape)
        B = (dims[-4] if len(dims) == 4 else 1) if B is None else int(B)  # None: the tensor's
        H = (dims[-3] if len(dims) >= 3 else 1) if H is None else int(H)
        block_q, block_kv = _block_size(BLOCK_SIZE, where)
        device = _cuda_device(device)
        if doc_ids is not None:
            raise ValueError(f"{where}: doc_ids are the document mask_mod's; mask_mod is a tensor")
        bits = _mask_bits(mask_mod, B, H, int(Q_LEN), int(KV_LEN), device, where)
        tensors, spec = _C.blocksparse_create_block_mask("tensor", int(bits.shape[0]), int(bits.shape[1]), int(Q_LEN),
                                                         int(KV_LEN), block_q, block_kv, str(device), None, bits)
        return BlockMask(tensors, (block_q, block_kv), (int(Q_LEN), int(KV_LEN)), spec, None, bits)
    if callable(mask_mod):
        raise TypeError(f"{where}: mask_mod must be a spec string such as 'causal' (attnlab.mods); for a Python "
                        "callable use torch's create_block_mask and attnlab.BlockMask.from_torch(bm, mask_mod=spec)")
    if not isinstance(mask_mod, str):
        raise TypeError(f"{where}: mask_mod must be a spec string such as 'causal', got {type(mask_mod).__name__}")
    B = 1 if B is None else int(B)
    H = 1 if H is None else int(H)
    block_q, block_kv = _block_size(BLOCK_SIZE, where)
    device = _cuda_device(device)
    ids = _doc_ids(doc_ids, B, device, where)
    tensors, spec = _C.blocksparse_create_block_mask(mask_mod, B, H, int(Q_LEN), int(KV_LEN), block_q, block_kv,
                                                     str(device), ids)
    return BlockMask(tensors, (block_q, block_kv), (int(Q_LEN), int(KV_LEN)), spec, ids)


def kept_pairs(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda", doc_ids=None):
    """The exact number of (b, h, q, kv) in [B, H, Q_LEN, KV_LEN] that
    mask_mod (a spec, or a keep tensor as create_block_mask takes one) keeps,
    counted on the GPU: the pairs of the FLOP count 2·B·H·(D + Dv)·pairs (README)."""
    device = _cuda_device(device)
    if is_tensor_mask(mask_mod):
        bits = _mask_bits(mask_mod, int(B), int(H), int(Q_LEN), int(KV_LEN), device, "attnlab.kept_pairs")
        return _C.blocksparse_kept_pairs("tensor", int(B), int(H), int(Q_LEN), int(KV_LEN), str(device), None, bits)
    return _C.blocksparse_kept_pairs(mask_mod, int(B), int(H), int(Q_LEN), int(KV_LEN), str(device),
                                     _doc_ids(doc_ids, int(B), device, "attnlab.kept_pairs"))


def _blocksparse_backward(q, k, v, out, lse, dout, lists, block_size, mask_mod, mask_bits, doc_ids, score_mod, bias,
                          needs_dbias, scale, enable_gqa, deterministic):
    """dq, dk, dv and (needs_dbias, else None) the bias score_mod's gradient in
    the bias's dtype and shape, from the block-sparse backward on a block
    mask's 8 `lists` (flex_attention's autograd, and dmattn's backward on the
    engine). dBias = dS', summed where pairs share an element (the bias
    broadcasts, or holds one head per KV head's group of query heads): by
    atomic adds into the bias's shape, or, deterministic, stored per pair in
    the full shape and summed here in a fixed order."""
    dbias = None
    if needs_dbias:
        full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        broadcast = tuple(d for d in range(3) if bias.shape[d] == 1 and full[d] > 1)
        grouped = bias.shape[1] not in (1, full[1])
        shape = full if deterministic and (broadcast or grouped) else bias.shape
        dbias = torch.zeros(shape, dtype=torch.float32, device=q.device)
    dq, dk, dv = _C.blocksparse_backward(q, k, v, out, lse, dout, lists[4:], lists[:4], *block_size, mask_mod,
                                         score_mod, scale, enable_gqa, doc_ids, deterministic, mask_bits, bias, dbias)
    if dbias is not None:
        if dbias.shape != bias.shape:
            if broadcast:
                dbias = dbias.sum(dim=broadcast, keepdim=True)
            if grouped:  # each KV head's query heads
                dbias = dbias.unflatten(1, (bias.shape[1], full[1] // bias.shape[1])).sum(2)
        dbias = dbias.to(bias.dtype)
    return dq, dk, dv, dbias


class _FlexAttention(torch.autograd.Function):
    """The autograd node, on contiguous q, k, v (flex_attention prepares them)
    and a bias score_mod's contiguous 4-D tensor (else None)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, block_mask, score_mod, scale, enable_gqa, doc_ids):
        lists = block_mask.tensors()
        bits = block_mask.mask_bits
        out, lse = _C.blocksparse_forward(q, k, v, lists[:4], *block_mask.BLOCK_SIZE, block_mask.mask_mod,
                                          score_mod, scale, enable_gqa, doc_ids, bits, bias)
        ctx.save_for_backward(q, k, v, out, lse, *lists, doc_ids, bits, bias)
        ctx.block_size, ctx.mask_mod, ctx.score_mod = block_mask.BLOCK_SIZE, block_mask.mask_mod, score_mod
        ctx.scale, ctx.enable_gqa = scale, enable_gqa
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):  # grad_lse: lse is not differentiable
        q, k, v, out, lse, *lists, doc_ids, bits, bias = ctx.saved_tensors
        dq, dk, dv, dbias = _blocksparse_backward(q, k, v, out, lse, grad_out.contiguous(), lists, ctx.block_size,
                                                  ctx.mask_mod, bits, doc_ids, ctx.score_mod, bias,
                                                  bias is not None and ctx.needs_input_grad[3], ctx.scale,
                                                  ctx.enable_gqa, torch.are_deterministic_algorithms_enabled())
        return dq, dk, dv, dbias, None, None, None, None, None


def flex_attention(query, key, value, block_mask=None, score_mod=None, scale=None, enable_gqa=False,
                   return_lse=False):
    """torch.nn.attention.flex_attention on attnlab's block-sparse kernels
    (kernels/blocksparse/blocksparse_fwd.h, blocksparse_bwd.h).

        query [B, H, Q_LEN, D], key [B, Hkv, KV_LEN, D], value [B, Hkv, KV_LEN, Dv]:
            CUDA, float16 or bfloat16, one dtype and device (non-contiguous
            tensors are copied with .contiguous()); Hkv != H needs enable_gqa
            (query head h reads KV head h // (H // Hkv)). Head dims: 64, 128,
            256, 192/128, 128/64 (D/Dv).
        block_mask: an attnlab.BlockMask for (Q_LEN, KV_LEN) (create_block_mask,
            or BlockMask.from_torch); its B and H the problem's or 1. None:
            every pair.
        score_mod: a spec of attnlab.mods on the scaled score: "rel_bias",
            "alibi", "softcap:C"; or a bias tensor added to it, 1 to 4 dims
            broadcasting to [B, H, Q_LEN, KV_LEN] (each dim 1 or full; cast
            to the inputs' dtype), differentiable (its gradient summed over
            the dims it broadcasts along); None: none.
        scale: None for 1/sqrt(D).

    s = score_mod(scale · q·kᵀ) on the pairs the block mask's lists visit and its
    mask_mod keeps; out = softmax(s)·v in the input dtype; a row that sees no
    key gives out = 0 (lse = -inf). return_lse=True returns (out, lse), lse
    [B, H, Q_LEN] float32, the natural log of each row's softmax denominator
    (not differentiable). Raises ValueError (TypeError for dtypes) with one
    line when the kernel cannot take the inputs. out is differentiable in
    query, key and value (kernels/blocksparse/blocksparse_bwd.h: head dims 64,
    128, 192/128 and 256; block sizes multiples of its tile, 128 x 128 keys
    (64 x 64 at D = 256);
    bitwise deterministic under torch.use_deterministic_algorithms(True)); the
    backward raises ValueError with one line where it cannot take the problem.
    """
    where = "attnlab.flex_attention"
    bias = score_mod if isinstance(score_mod, torch.Tensor) else None
    if bias is None and callable(score_mod):
        raise TypeError(f"{where}: score_mod must be a spec string such as 'alibi' (attnlab.mods) or a bias tensor, "
                        "not a callable: the kernel's score_mods are compiled in")
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        raise TypeError(f"{where}: query, key and value must be torch.Tensors")
    if bias is None:
        try:
            parse_score_spec(score_mod)
        except ValueError as error:
            raise ValueError(f"{where}: {str(error).split(': ', 1)[-1]}") from None
    q, k, v = (t.contiguous() for t in (query, key, value))
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"{where}: query, key and value must be 4-D [B, H, N, D], got {list(q.shape)}, "
                         f"{list(k.shape)}")
    Q_LEN, KV_LEN = q.shape[2], k.shape[2]
    if bias is not None:
        if not bias.is_floating_point():
            raise TypeError(f"{where}: a bias score_mod must be a floating-point tensor, got {bias.dtype}")
        bias = _as_4d(bias, "the bias score_mod", where)
        _check_broadcast(tuple(bias.shape), (q.shape[0], q.shape[1], Q_LEN, KV_LEN), "the bias score_mod", where)
        if bias.device != q.device:
            raise ValueError(f"{where}: the bias score_mod is on {bias.device}, the inputs on {q.device}")
        bias = bias.to(q.dtype).contiguous()
    if block_mask is None:
        block_mask = create_block_mask("none", 1, 1, Q_LEN, KV_LEN, device=q.device)
    elif not isinstance(block_mask, BlockMask):
        raise TypeError(f"{where}: block_mask must be an attnlab.BlockMask (torch's: "
                        f"attnlab.BlockMask.from_torch(bm, mask_mod=spec)), got {type(block_mask).__name__}")
    if block_mask.seq_lengths != (Q_LEN, KV_LEN):
        raise ValueError(f"{where}: block_mask was made for (Q_LEN, KV_LEN) = {block_mask.seq_lengths}, the inputs "
                         f"are {(Q_LEN, KV_LEN)}")
    if block_mask.device != q.device:
        raise ValueError(f"{where}: block_mask is on {block_mask.device}, the inputs on {q.device}")
    doc_ids = block_mask.doc_ids
    if doc_ids is not None and doc_ids.shape[0] != q.shape[0]:
        if doc_ids.shape[0] != 1:
            raise ValueError(f"{where}: block_mask's doc_ids have {doc_ids.shape[0]} rows, the inputs B = {q.shape[0]}")
        doc_ids = doc_ids.expand(q.shape[0], -1).contiguous()  # the kernel reads the ids of each batch
    spec = "bias" if bias is not None else "none" if score_mod is None else score_mod
    out, lse = _FlexAttention.apply(q, k, v, bias, block_mask, spec, None if scale is None else float(scale),
                                    bool(enable_gqa), doc_ids)
    return (out, lse) if return_lse else out
