"""The mask_mod and score_mod specs of attnlab's block-sparse attention
(kernels/blocksparse/mods.h), in Python: their grammar, and each written as the
callable torch.nn.attention.flex_attention takes, so that torch can build the
same block mask (create_block_mask) and compute the same attention.

    mask_mod(b, h, q_idx, kv_idx) -> keep        score_mod(score, b, h, q_idx, kv_idx) -> score'

Specs are "NAME" or "NAME:ARGS", one per row of MASK_ROWS and SCORE_ROWS:
    mask_mods   none, causal, sliding_window:L,R, block_diagonal:B, mini_causal:B,
                prefix_lm:P, dilated_sliding_window:W,S, document
    score_mods  none, rel_bias, alibi, softcap:C
The rows are those of kernels/blocksparse/mods_table.h, the kernels' table,
which a CPU test holds them to (tests/python_cpu/test_blocksparse_specs.py):
adding a mod is a row there and here (docs/blocksparse.md).
`causal` and `sliding_window` are aligned to the bottom-right corner (offset
KV_LEN - Q_LEN, as FlashAttention's); the others to the top-left; `document`
keeps a pair when doc_ids[b, q] == doc_ids[b, kv] (the same ids for queries
and keys). A keep tensor (the mask_mod) and a bias tensor (the score_mod)
have no spec here: they come from tensors (attnlab.create_block_mask(keep,
...), attnlab.flex_attention(..., score_mod=bias)); the kernels name them
"tensor" (a BlockMask's mask_mod then) and "bias" (rows with tensor=True),
which MASK_MODS and SCORE_MODS leave out and parse_mask_spec and
parse_score_spec refuse. The C++ parser (attnlab._C.parse_mask_mod) is the
authority the kernels use; this module needs neither torch nor the extension
(the CPU tests import it alone), and its callables use only operators and
tensor methods.
"""
import math
from typing import NamedTuple

__all__ = ["MASK_MODS", "SCORE_MODS", "MASK_ROWS", "SCORE_ROWS", "parse_mask_spec", "parse_score_spec",
           "canonical_mask_spec", "torch_mask_mod", "torch_score_mod", "random_document_ids", "example_specs",
           "spec_draws"]


class ModRow(NamedTuple):
    """One mask_mod or score_mod: the columns of its row in mods_table.h
    (name, args, form, least, need, tensor), then what the tests and the fuzzer
    draw from: `examples`, argument tuples, and `draws`, per argument the
    values a random spec picks one of."""
    name: str
    args: str = ""          # the arguments as the lists name them: "L,R"
    form: str = ""          # ... as the "takes ..." message says them
    least: tuple = ()       # per argument its least value (mask_mods)
    need: str = ""          # what "needs ..." says of one below its least
    tensor: bool = False    # reads a tensor the caller attaches: no spec here
    examples: tuple = ((),)
    draws: tuple = ()

    def spec(self, args=()):
        return self.name + (":" + ",".join(str(a) for a in args) if args else "")


MASK_ROWS = (
    ModRow("none"),
    ModRow("causal"),
    ModRow("sliding_window", "L,R", "LEFT,RIGHT", (0, 0), examples=((64, 32), (128, 0)),
           draws=(range(0, 301), range(0, 301))),
    ModRow("block_diagonal", "B", "B (the block, >= 1)", (1,), "a block >= 1", examples=((100,),),
           draws=(range(1, 401),)),
    ModRow("mini_causal", "B", "B (the block, >= 1)", (1,), "a block >= 1", examples=((64,),),
           draws=(range(1, 201),)),
    ModRow("prefix_lm", "P", "P (the prefix length)", (0,), examples=((150,),), draws=(range(0, 601),)),
    ModRow("dilated_sliding_window", "W,S", "W,S (window, stride >= 1)", (0, 1), "a stride >= 1",
           examples=((256, 2),), draws=(range(0, 601), range(1, 5))),
    ModRow("document"),
    ModRow("tensor", tensor=True, examples=()),
)
SCORE_ROWS = (
    ModRow("none"),
    ModRow("rel_bias"),
    ModRow("alibi"),
    ModRow("softcap", "C", "C > 0", examples=((2,), (30,)), draws=((1, 5, 20, 50),)),
    ModRow("bias", tensor=True, examples=()),
)

# name -> the form of its arguments, as the C++ parser's messages say it ("" = none)
MASK_MODS = {r.name: r.form for r in MASK_ROWS if not r.tensor}
SCORE_MODS = {r.name: r.form for r in SCORE_ROWS if not r.tensor}
_MASK_BY_NAME = {r.name: r for r in MASK_ROWS if not r.tensor}
_SCORE_BY_NAME = {r.name: r for r in SCORE_ROWS if not r.tensor}


def _spec_list(rows):
    return ", ".join(r.name + (":" + r.args if r.args else "") for r in rows if not r.tensor)


_MASK_LIST, _SCORE_LIST = _spec_list(MASK_ROWS), _spec_list(SCORE_ROWS)


def _split(spec, kind):
    if not isinstance(spec, str):
        raise TypeError(f"attnlab: a {kind} spec is a string such as 'causal', got {type(spec).__name__}")
    return spec.partition(":")


def parse_mask_spec(spec):
    """(name, args) of a mask_mod spec, args a tuple of ints; ValueError with
    one line when it is not one. parse_mask_spec("sliding_window:128,0") ->
    ("sliding_window", (128, 0))."""
    name, _, text = _split(spec, "mask_mod")
    row = _MASK_BY_NAME.get(name)
    if row is None or (not row.args and text):
        raise ValueError(f"attnlab: unknown mask_mod '{spec}' ({_MASK_LIST})")
    if not row.args:
        return name, ()
    items = text.split(",")
    if len(items) != len(row.args.split(",")) or not all(i.isdigit() and i.isascii() and int(i) <= 1 << 30 for i in items):
        raise ValueError(f"attnlab: mask_mod {name} takes {row.form}, got '{text}'")
    args = tuple(int(i) for i in items)
    if any(a < least for a, least in zip(args, row.least)):
        raise ValueError(f"attnlab: mask_mod {name} needs {row.need}")
    return name, args


def parse_score_spec(spec):
    """(name, args) of a score_mod spec: ("softcap", (30.0,)), ("alibi", ());
    None is "none". ValueError with one line when it is not one."""
    if spec is None:
        return "none", ()
    name, _, text = _split(spec, "score_mod")
    row = _SCORE_BY_NAME.get(name)
    if row is not None and not row.args and not text:
        return name, ()
    if row is not None and row.args:  # one number > 0
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"attnlab: score_mod {name} takes {row.form}, got '{text}'")
        return name, (value,)
    raise ValueError(f"attnlab: unknown score_mod '{spec}' ({_SCORE_LIST})")


def example_specs(rows):
    """Every example spec of the rows, in their order: the tests' and the
    fuzzer's curated mods."""
    return [r.spec(args) for r in rows for args in r.examples]


def spec_draws(rows):
    """One function per row (those without arguments first, then the others,
    each in the rows' order) that draws a spec of it from a random.Random:
    a choice among these is uniform over the kinds of mod."""
    ordered = [r for r in rows if not r.tensor and not r.args] + [r for r in rows if not r.tensor and r.args]
    return [lambda rng, r=r: r.spec(tuple(rng.choice(d) for d in r.draws)) for r in ordered]


def canonical_mask_spec(spec):
    """The spec as the C++ parser names it back: "sliding_window:128,0"."""
    name, args = parse_mask_spec(spec)
    return name + (":" + ",".join(str(a) for a in args) if args else "")


def torch_mask_mod(spec, Q_LEN, KV_LEN, doc_ids=None):
    """The mask_mod of `spec` as a Python callable (b, h, q_idx, kv_idx) ->
    keep, for torch's create_block_mask and flex_attention (and on plain ints).
    `document` reads doc_ids[b, q] (a [B, N] tensor, N >= max(Q_LEN, KV_LEN))."""
    name, args = parse_mask_spec(spec)
    off = KV_LEN - Q_LEN
    if name == "none":
        return lambda b, h, q, k: (q >= 0) | (k >= 0)  # True, as a tensor where the indices are
    if name == "causal":
        return lambda b, h, q, k: k <= q + off
    if name == "sliding_window":
        left, right = args
        return lambda b, h, q, k: (k >= q + off - left) & (k <= q + off + right)
    if name == "block_diagonal":
        block = args[0]
        return lambda b, h, q, k: q // block == k // block
    if name == "mini_causal":
        block = args[0]
        return lambda b, h, q, k: q % block >= k % block
    if name == "prefix_lm":
        prefix = args[0]
        return lambda b, h, q, k: ((q < prefix) & (k < prefix)) | (q >= k)
    if name == "dilated_sliding_window":
        window, stride = args
        return lambda b, h, q, k: (q >= k) & (q - k < window) & ((q - k) % stride == 0)
    if name == "document":
        if doc_ids is None:
            raise ValueError("attnlab: the document mask_mod needs doc_ids")
        return lambda b, h, q, k: doc_ids[b, q] == doc_ids[b, k]
    raise NotImplementedError(f"attnlab: the mask_mod {name} has a row but no callable here")


def _tanh(x):
    return x.tanh() if hasattr(x, "tanh") else math.tanh(x)


def torch_score_mod(spec, H):
    """The score_mod of `spec` as a Python callable (score, b, h, q_idx,
    kv_idx) -> score' on the scaled score, for torch's flex_attention; None
    for "none" (flex_attention's default). alibi's slopes are 2^(-8(h+1)/H)."""
    name, args = parse_score_spec(spec)
    if name == "none":
        return None
    if name == "rel_bias":
        return lambda s, b, h, q, k: s + abs(q - k)
    if name == "alibi":
        return lambda s, b, h, q, k: s - 2.0 ** (-8.0 * (h + 1) / H) * abs(q - k)
    if name == "softcap":
        # C as a literal in the function's code, not a captured float: torch's
        # flex_attention runs through dynamo, which turns a captured float that
        # changes between calls into a symbolic one that flex_attention refuses.
        return eval(f"lambda s, b, h, q, k: {args[0]!r} * _tanh(s / {args[0]!r})", {"_tanh": _tanh})
    raise NotImplementedError(f"attnlab: the score_mod {name} has a row but no callable here")


def random_document_ids(B, N, K, generator):
    """Document ids [B][N] as lists: per batch, N cut into K documents of
    random lengths (>= 1) at K - 1 distinct points drawn by `generator` (a
    random.Random); the ids count up from 0. The benchmark's `document:K`."""
    if not 1 <= K <= N:
        raise ValueError(f"attnlab: {K} documents do not fit {N} tokens")
    rows = []
    for _ in range(B):
        cuts = set(generator.sample(range(1, N), K - 1))
        row, doc = [], 0
        for i in range(N):
            doc += i in cuts
            row.append(doc)
        rows.append(row)
    return rows
