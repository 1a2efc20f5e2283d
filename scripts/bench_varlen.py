#!/usr/bin/env python3
"""attnlab's variable-length attention (attnlab.varlen_attention, forward and
backward) and paged-KV decoding (attnlab.decode) beside every peer that runs
the same problem, timed and checked in one process.

    PYTHONPATH=build/python python3 scripts/bench_varlen.py --unverified            # the full set
    PYTHONPATH=build/python python3 scripts/bench_varlen.py --unverified --quick    # small shapes
    PYTHONPATH=build/python python3 scripts/bench_varlen.py --unverified --parts decode \\
        --cache-lens 4K,1000/9000 --page-sizes 64 --decode-nq 1

Both attnlab kernels have not run on a GPU yet: they run only with
ATTNLAB_UNVERIFIED=1. This script sets it for itself with --unverified, and
without it refuses (one line, exit 2); our rows are marked `unverified` in the
CSV. `scripts/gpu_check.sh bench` runs it after its benchmarks (VARLEN_BUDGET
seconds, PEERS=0: no peer rows), into results/<gpu>/varlen.csv.

Variable length (part `varlen`): one packed batch, lengths drawn from --seed
(geometric on [--min-len, --max-len], its rate solved so that its mean is
--mean, drawn until the total reaches --total, the last length cut so that the
total is exactly --total; default 1 to 16K, mean 2K, 64K tokens) or given by
--lengths; H = 16, D = 128, bf16 by default; causal (bottom-right within each
sequence) and not. Rows, forward then backward (each of dQ, dK, dV of out·dO
for a random dO, through autograd, the forward graph built untimed and the
backward alone timed; --no-bwd: forward only):
  attnlab varlen      ours: attnlab.varlen_attention on the packed batch
  fa4 varlen          FlashAttention-4's flash_attn_varlen_func (flash_attn.cute)
  sdpa nested         torch SDPA on jagged nested tensors (views of the packed
                      batch, transposed to [B, H, j, D]); the note names the
                      backend torch picks
  flex document       torch.compile'd flex_attention on the packed batch as one
                      sequence [1, H, total, D], a document block mask
                      (create_block_mask of a mask_mod reading each token's
                      document id; causal within a document when causal)
  attnlab padded      a yardstick: attnlab's dense engine (attnlab.forward's
                      default variant; attnlab.attention backward) on the
                      batch padded with zeros to B x the longest sequence.
                      Causal, each sequence's rows are the packed problem's
                      (its padding rows and keys lie after it; dO is 0 there);
                      not causal, its rows attend the padding keys, so it is
                      timed only. Where the padded batch does not fit, a row
                      `unsupported` says so
TFLOPS for every row over the packed batch's exact unmasked pairs: forward
2·H·(D + Dv)·pairs, backward 2·H·(3D + 2Dv)·pairs, pairs = the sum over the
sequences of the (query, key) pairs the mask keeps (n·n, or n·(n + 1)/2
causal), so the padded row's TFLOPS count only the work the packing keeps.

Paged decoding (part `decode`): B = 64 sequences, H = 32 query heads, Hkv = 8,
D = 128, bf16, causal (new token t of Nq sees keys up to L - Nq + t, the new
tokens being the cache's last Nq keys); cache lengths L 4K, 16K, 64K, 128K
(--cache-lens: each item one length for every sequence, or lengths joined by
'/', repeated over the B sequences), pages of 64 and 256 rows, Nq = 1 and 4. A
length whose cache does not fit in the GPU's free memory is not run (one line).
The cache is [pages, P, Hkv, D] in pages of the largest page size P (256),
each sequence's pages a random permutation of the cache's (from the seed); a
smaller page size p views the same memory (each page of P rows as P/p pages
in order), so every page size reads the same bytes. Rows:
  attnlab decode      ours: attnlab.decode, one row per page size
  fa4 paged           FlashAttention-4's flash_attn_varlen_func with page_table
                      and seqused_k, one row per page size (`unsupported`
                      where it refuses a page table on this GPU; one line and
                      no row where its signature has none)
  flashinfer paged    FlashInfer's BatchDecodeWithPagedKVCacheWrapper (Nq = 1)
                      or BatchPrefillWithPagedKVCacheWrapper (Nq > 1, causal),
                      planned once outside the timing, one row per page size
  flex contiguous     compiled flex_attention on the cache gathered to
                      contiguous [B, Hkv, L, D] (the gather not timed), GQA,
                      a bottom-right causal block mask
  sdpa contiguous     torch SDPA on the same contiguous cache, Nq = 1 and every
                      sequence the same length only (the note names the
                      backend)
  copy (bandwidth)    a yardstick: a device-to-device copy (torch .copy_) of
                      1 GiB (halved where that does not fit)
GB/s: the bytes the problem must move per call, K and V of every cache once
(L·Hkv·(D + Dv)·2 bytes) plus q read and O written (not a kernel's own partial
results, nor the table); the copy's, its bytes read and written; each row's
also as a fraction of the copy's in the same rounds. TFLOPS: 2·H·(D + Dv)·pairs.

Timing (gpu_timing.py, the harness's rule): each row's first call, which
compiles what JIT-compiles (FlashAttention-4's CuTe DSL, torch.compile,
FlashInfer) and gives the outputs checked, is made before any timed call and
its wall time printed once when over a second; then warm-up, then --iters
rounds over every row of a case, each call after an L2 flush and a queued GPU
delay, between CUDA events; the median. Our timed calls skip the host-side
check of the offsets and tables (check_seqlens / check_tables False: each is a
synchronisation), which the first call makes. A peer that is not installed is
one line and no row; a peer that refuses a shape is a row `unsupported` with
its reason. The cases run in turn, a varlen case, then a decode case, and so on
(the decode cases by cache length, then Nq), so that a run cut by --budget has
rows of both parts.

The check (unless --no-check), every row, sequence by sequence: the fp32
unfused reference of that sequence alone (softmax(q·kᵀ·scale)·v, its LSE, and
for the backward its autograd gradients for the same dO), the same unfused
path in the inputs' dtype the yardstick, and the project's rule (attnlab.judge,
the harness's: err <= 2 x the yardstick's err on the sequence + 2 x the
reference's rounding to the dtype, nothing NaN or infinite, the LSE within
1e-3 where the row returns one); the row's verdict is its worst sequence's.
A failing row is written FAIL, never left out.

CSV (--csv, default results/<gpu>/varlen.csv; appended, case by case; a file
of other columns is refused), one row per line of the table, columns:
  gpu, driver, cuda, commit, date   where it ran (run_info.py)
  part          varlen or decode
  row           the row's name (above; backward rows end in " bwd")
  kind          ours, peer or yardstick
  direction     fwd or bwd
  B             the sequences
  H, Hkv        query and KV heads
  D, Dv         head dims of q·k and of v
  dtype         fp16 or bf16
  causal        1 or 0
  Nq, Nk        varlen: the longest sequence (both); decode: the new tokens
                per sequence and the longest cache
  lengths       varlen: every sequence's length, joined by '/'; decode: the
                cache length, or every sequence's joined by '/' where they
                differ
  total         varlen: the packed batch's tokens; decode: every cache's keys
  page_size     decode rows on the paged cache; empty for the others
  pairs         the unmasked (query, key) pairs of one head over the batch
  bytes         decode: the bytes the row moves per call; varlen: empty
  time_ms, tflops, gbps, copy_fraction   empty where they do not apply
  err, tol      the worst sequence's max error and its bound (backward: of
                the gradient nearest its bound)
  pass          PASS, FAIL, unchecked, unsupported or error
  unverified    1 for the rows of the kernels that have not run on a GPU
  seed          the inputs' seed: case k's is --seed + k (varlen lengths are
                drawn from --seed itself)
  note          the check's words, the reason, the backend, the software line

Exit: 0 when every row passed, was timed only or could not run; 1 when a row
FAILED or one of ours raised an error; 2 on bad options or without
--unverified (one line); 3 without torch, a GPU or the attnlab module (one
line).
"""
import argparse
import bisect
import itertools
import math
import os
import random
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import run_info  # noqa: E402

NAME = "bench_varlen.py"
VARLEN, DECODE = "varlen", "decode"
OURS, PEER, YARDSTICK = "ours", "peer", "yardstick"
FWD, BWD = "fwd", "bwd"
# The rows' names (backward rows add " bwd").
OURS_VARLEN, FA4_VARLEN, SDPA_NESTED, FLEX_DOCUMENT, PADDED = (
    "attnlab varlen", "fa4 varlen", "sdpa nested", "flex document", "attnlab padded")
OURS_DECODE, FA4_PAGED, FLASHINFER_PAGED, FLEX_CONTIGUOUS, SDPA_CONTIGUOUS, COPY = (
    "attnlab decode", "fa4 paged", "flashinfer paged", "flex contiguous", "sdpa contiguous", "copy (bandwidth)")
COLUMNS = ("gpu", "driver", "cuda", "commit", "date", "part", "row", "kind", "direction", "B", "H", "Hkv", "D", "Dv",
           "dtype", "causal", "Nq", "Nk", "lengths", "total", "page_size", "pairs", "bytes", "time_ms", "tflops",
           "gbps", "copy_fraction", "err", "tol", "pass", "unverified", "seed", "note")
DTYPES = ("bf16", "fp16")
ELEMENT_BYTES = 2  # fp16 and bf16
INSTALL = {"fa4": "pip install attnlab[peers]", "flashinfer": "pip install flashinfer-python"}

# The options' defaults: the full set, and --quick's small shapes (an option given on the command line wins).
FULL = {"total": "64K", "mean": "2K", "max_len": "16K", "decode_B": 64, "cache_lens": "4K,16K,64K,128K",
        "warmup": 3, "iters": 20}
QUICK = {"total": "8K", "mean": "512", "max_len": "2K", "decode_B": 8, "cache_lens": "1K,4K", "warmup": 1,
         "iters": 5}

CHUNK = 1 << 27        # elements of S the reference holds at a time (fp32: 512 MiB); a quarter with autograd
COPY_BYTES = 1 << 30   # the copy yardstick's buffer, halved down to COPY_LEAST where it does not fit
COPY_LEAST = 64 << 20
MEMORY_MARGIN = 4 << 30  # room the decode part leaves beside its caches (copy, reference, workspaces)
FLASHINFER_WORKSPACE = 128 << 20
DENSE_MASK_LIMIT = 1 << 32  # the largest document mask (total² booleans) built densely; beyond, compiled


class BadInput(ValueError):
    """Options this script cannot run: one line, exit 2."""


# ---- sizes, lengths and counts (no torch) ---------------------------------------------------

def parse_size(text, what, least=1):
    """'64K' -> 65536, '2k' -> 2048, '1M' -> 1048576, '517' -> 517; below `least` or not a size: BadInput."""
    t = str(text).strip()
    scale = {"k": 1 << 10, "m": 1 << 20}.get(t[-1:].lower(), 1)
    digits = t[:-1] if scale > 1 else t
    if not digits.isdigit() or int(digits) * scale < least:
        raise BadInput(f"{what} takes a whole number of at least {least} (K and M for 1024 and 1024², as 64K), "
                       f"got '{text}'")
    return int(digits) * scale


def parse_list(text, what, least=1):
    """'64,256' -> [64, 256] (each a parse_size); an empty list is a BadInput."""
    items = [parse_size(item, what, least) for item in str(text).split(",") if item.strip()]
    if not items:
        raise BadInput(f"{what} takes a list separated by commas, got '{text}'")
    return items


def parse_cache_cases(text):
    """--cache-lens: '4K,16K' -> [(4096,), (16384,)]; an item 'A/B/...' gives each sequence's length in turn."""
    cases = []
    for item in str(text).split(","):
        if item.strip():
            cases.append(tuple(parse_size(x, "--cache-lens", 1) for x in item.split("/")))
    if not cases:
        raise BadInput(f"--cache-lens takes lengths separated by commas, got '{text}'")
    return cases


def cache_lengths(spec, batch):
    """Each of `batch` sequences' cache length from one --cache-lens item: sequence b gets spec[b % len(spec)]."""
    return tuple(spec[b % len(spec)] for b in range(batch))


def _offset_mean(t, count):
    """Mean of i = 0 .. count - 1 drawn with weights e^(t·i): a geometric distribution cut to `count` values."""
    if abs(t) < 1e-12:
        return (count - 1) / 2
    if t > 0:  # mirrored: the weights rise, so the mean counts down from the top
        return (count - 1) - _offset_mean(-t, count)
    # sum i·r^i / sum r^i with r = e^t < 1, in closed form: r / (1 - r) - count·r^count / (1 - r^count)
    return math.exp(t) / -math.expm1(t) - count * math.exp(count * t) / -math.expm1(count * t)


def length_weights(low, high, mean):
    """Cumulative weights of the lengths low .. high: P(n) ∝ e^(t·n), t solved (bisection) so that the mean is
    `mean`; a BadInput unless low <= mean <= high."""
    if not 1 <= low <= high:
        raise BadInput(f"the lengths' bounds must be 1 <= --min-len <= --max-len, got {low} and {high}")
    if not low <= mean <= high:
        raise BadInput(f"--mean must lie within --min-len and --max-len ({low} to {high}), got {mean}")
    count = high - low + 1
    lo, hi = -50.0, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if _offset_mean(mid, count) < mean - low:
            lo = mid
        else:
            hi = mid
    t = (lo + hi) / 2
    top = max(0.0, t * (count - 1))  # the largest exponent, taken out so that no weight overflows
    return list(itertools.accumulate(math.exp(t * i - top) for i in range(count)))


def distribution_mean(low, cumulative):
    """The mean length of length_weights' distribution (the tests hold it to --mean)."""
    weights = [cumulative[0]] + [b - a for a, b in zip(cumulative, cumulative[1:])]
    return low + sum(i * w for i, w in enumerate(weights)) / cumulative[-1]


def draw_lengths(seed, total, mean, low, high):
    """Sequence lengths from `seed`, drawn (length_weights) until they sum to `total`, the last one cut so that
    they sum to it exactly. Python's random.Random(seed).random() alone, so the same seed gives the same lengths
    on every Python."""
    if total < 1:
        raise BadInput(f"--total must be at least 1 token, got {total}")
    cumulative = length_weights(low, high, mean)
    rng = random.Random(seed)
    lengths, left = [], total
    while left > 0:
        i = min(bisect.bisect_right(cumulative, rng.random() * cumulative[-1]), len(cumulative) - 1)
        lengths.append(min(low + i, left))
        left -= lengths[-1]
    return lengths


def pairs(nq, nk, causal):
    """The (query, key) pairs of one head that the mask keeps; causal: bottom-right aligned, query i sees key j iff
    j <= i + nk - nq, so max(i + nk - nq + 1, 0) keys: the last query sees nk, each one before it one fewer, down
    to 1 or to m + 1 (m = max(nk - nq, 0)), which sums to 1 + .. + nk less 1 + .. + m."""
    if nq <= 0 or nk <= 0:
        return 0
    if not causal:
        return nq * nk
    m = max(nk - nq, 0)
    return (nk * (nk + 1) - m * (m + 1)) // 2


def offsets(lengths):
    """[0, l0, l0 + l1, ...]: the packed batch's cu_seqlens."""
    return [0] + list(itertools.accumulate(lengths))


# ---- the problems ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One problem: a packed batch (part varlen: `lengths` the sequences') or a batch of caches (part decode:
    `lengths` each sequence's cache, Nq new tokens each)."""
    part: str
    lengths: tuple
    H: int
    Hkv: int
    D: int
    Dv: int
    dtype: str = "bf16"
    causal: bool = True
    Nq: int = 0
    page_sizes: tuple = ()

    @property
    def B(self):
        return len(self.lengths)

    @property
    def total(self):
        return sum(self.lengths)

    @property
    def longest(self):
        return max(self.lengths, default=0)

    @property
    def pairs(self):
        """Unmasked pairs of one head over the batch: each sequence with itself (varlen), or its Nq new tokens
        with its cache (decode)."""
        if self.part == VARLEN:
            return sum(pairs(n, n, self.causal) for n in self.lengths)
        return sum(pairs(self.Nq, n, self.causal) for n in self.lengths)

    def flops(self, direction):
        """The harness's convention: forward 2·H·(D + Dv)·pairs, backward 2·H·(3D + 2Dv)·pairs."""
        per_pair = (self.D + self.Dv) if direction == FWD else (3 * self.D + 2 * self.Dv)
        return 2 * self.H * per_pair * self.pairs

    @property
    def kv_bytes(self):
        """Decode: K and V of every cache, read once."""
        return self.total * self.Hkv * (self.D + self.Dv) * ELEMENT_BYTES

    @property
    def qo_bytes(self):
        """Decode: q read and O written."""
        return self.B * self.Nq * self.H * (self.D + self.Dv) * ELEMENT_BYTES

    @property
    def bytes(self):
        return self.kv_bytes + self.qo_bytes

    @property
    def Nk(self):
        return self.longest

    @property
    def Nq_column(self):
        return self.longest if self.part == VARLEN else self.Nq

    def lengths_text(self):
        """The CSV's lengths: decode caches all of one length as that length; else every length, joined by '/'."""
        if self.part == DECODE and len(set(self.lengths)) == 1:
            return str(self.lengths[0])
        return "/".join(str(n) for n in self.lengths)

    def describe(self):
        heads = f"H={self.H}" if self.Hkv == self.H else f"H={self.H}/{self.Hkv}"
        dims = f"D={self.D}" if self.Dv == self.D else f"D={self.D}/{self.Dv}"
        mask = "causal" if self.causal else "not causal"
        if self.part == VARLEN:
            padded = self.B * self.longest * self.longest
            return (f"{self.B} sequences, {self.total} tokens ({length_summary(self.lengths)}), {heads}, {dims}, "
                    f"{self.dtype}, {mask}; pairs per head {self.pairs:.4g} "
                    f"({100.0 * self.pairs / max(padded, 1):.1f}% of the padded batch's)")
        caches = f"cache {self.lengths[0]}" if len(set(self.lengths)) == 1 else \
            f"caches {length_summary(self.lengths)}"
        pages = " and ".join(str(p) for p in self.page_sizes)
        return (f"B={self.B}, {caches}, Nq={self.Nq}, {heads}, {dims}, {self.dtype}, {mask}, pages of {pages}; "
                f"K and V {self.kv_bytes / 2**30:.2f} GiB + q and O {self.qo_bytes / 2**20:.2f} MiB")


def length_summary(lengths):
    """'1 to 14000, mean 1985.9' (or the lengths themselves, when few)."""
    if len(lengths) <= 8:
        return "lengths " + ",".join(str(n) for n in lengths)
    return f"{min(lengths)} to {max(lengths)}, mean {sum(lengths) / len(lengths):.1f}"


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


# ---- the paged cache's tables (no torch) -----------------------------------------------------

def pages_for(length, page_size):
    return -(-length // page_size)


def block_table(lengths, page_size, seed):
    """(table, pages): sequence b's pages in key order (table[b], padded with 0 to the longest's; at least one
    column), every page of the cache read by exactly one sequence, their places a random permutation of the
    cache's `pages` pages from `seed` (Fisher-Yates on random.Random(seed).random())."""
    counts = [pages_for(n, page_size) for n in lengths]
    total = sum(counts)
    perm = list(range(total))
    rng = random.Random(seed)
    for i in range(total - 1, 0, -1):
        j = min(int(rng.random() * (i + 1)), i)
        perm[i], perm[j] = perm[j], perm[i]
    width = max(max(counts, default=0), 1)
    table, start = [], 0
    for c in counts:
        table.append(perm[start:start + c] + [0] * (width - c))
        start += c
    return table, total


def split_table(table, lengths, big, small):
    """The table of the same cache read in pages of `small` rows (`big` a multiple of it): page p of `big` rows is
    pages p·r .. p·r + r - 1 of `small` rows (r = big / small), in order."""
    if big % small:
        raise BadInput(f"--page-sizes: {small} does not divide {big}")
    r = big // small
    rows = []
    for row, n in zip(table, lengths):
        rows.append([p * r + s for p in row[:pages_for(n, big)] for s in range(r)][:pages_for(n, small)])
    width = max(max((len(x) for x in rows), default=0), 1)
    return [x + [0] * (width - len(x)) for x in rows]


def csr_pages(table, lengths, page_size):
    """FlashInfer's page lists of the table: (indptr [B + 1], indices, last_page_len [B])."""
    counts = [pages_for(n, page_size) for n in lengths]
    indptr = offsets(counts)
    indices = [p for row, c in zip(table, counts) for p in row[:c]]
    last = [n - (c - 1) * page_size if c else 0 for n, c in zip(lengths, counts)]
    return indptr, indices, last


def decode_memory(case):
    """(paged, contiguous): the bytes of the paged cache (pages of the largest page size) and of the contiguous
    copy [B, Hkv, longest, D] the contiguous peers read."""
    big = max(case.page_sizes)
    paged = sum(pages_for(n, big) for n in case.lengths) * big * case.Hkv * (case.D + case.Dv) * ELEMENT_BYTES
    contiguous = case.B * case.longest * case.Hkv * (case.D + case.Dv) * ELEMENT_BYTES
    return paged, contiguous


# ---- rows and the CSV (no torch) ------------------------------------------------------------

@dataclass
class Entry:
    """One row of a case: built (its first call made and checked), then timed with the others."""
    name: str
    kind: str
    call: object = None       # a function, or (prepare, timed) for gpu_timing.Timer; None: not timed
    status: str = "unchecked"  # PASS, FAIL, unchecked, unsupported, error
    text: str = ""            # the check's words, or why the row did not run
    note: str = ""            # what else the row says (backend, variant, what is not timed)
    page_size: int = None
    unverified: bool = False
    nbytes: float = None      # decode: the bytes moved per call
    err: float = None
    tol: float = None
    ms: float = None


def csv_row(fields, case, direction, entry, seed, software, copy_rate=None):
    """One CSV row (COLUMNS) of `entry`; `fields` the run's gpu .. date columns; copy_rate the copy's GB/s in the
    same rounds, or None."""
    ran = entry.ms is not None
    is_copy = entry.name == COPY
    rate = gbps(entry.nbytes, entry.ms) if ran and entry.nbytes else None
    note = "; ".join(part for part in (entry.text, entry.note, software) if part)
    return {**fields, "part": case.part, "row": entry.name, "kind": entry.kind, "direction": direction,
            "B": case.B, "H": case.H, "Hkv": case.Hkv, "D": case.D, "Dv": case.Dv, "dtype": case.dtype,
            "causal": int(case.causal), "Nq": case.Nq_column, "Nk": case.Nk, "lengths": case.lengths_text(),
            "total": case.total, "page_size": "" if entry.page_size is None else entry.page_size,
            "pairs": case.pairs, "bytes": "" if entry.nbytes is None else f"{entry.nbytes:.0f}",
            "time_ms": f"{entry.ms:.6f}" if ran else "",
            "tflops": f"{tflops(case.flops(direction), entry.ms):.2f}" if ran and not is_copy else "",
            "gbps": f"{rate:.1f}" if rate else "",
            "copy_fraction": f"{rate / copy_rate:.3f}" if rate and copy_rate else "",
            "err": "" if entry.err is None else f"{entry.err:.3e}",
            "tol": "" if entry.tol is None else f"{entry.tol:.3e}", "pass": entry.status,
            "unverified": int(entry.unverified), "seed": seed, "note": note}


def csv_line(row):
    return ",".join(run_info.csv_text(row[c]) for c in COLUMNS)


def check_csv(path):
    """None when rows can be appended to `path` (absent, empty or of these COLUMNS), else why not."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path, encoding="utf-8") as f:
        if f.readline().rstrip("\r\n") != ",".join(COLUMNS):
            return f"{path} has other columns than this script's: use another file"
    return None


def append_rows(path, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write(",".join(COLUMNS) + "\n")
        for row in rows:
            f.write(csv_line(row) + "\n")


def table_line(entry, case, direction, copy_rate=None):
    """The row's line of the printed table."""
    kind = entry.kind + (", unverified" if entry.unverified else "")
    label = entry.name + (f" (pages of {entry.page_size})" if entry.page_size else "")
    head = f"  {label:<32} {kind:<20}"
    if entry.ms is None:
        return f"{head} {entry.status}: {entry.text}" + (f" ({entry.note})" if entry.note else "")
    parts = [f"{entry.ms:9.4f} ms"]
    if entry.name != COPY:
        parts.append(f"{tflops(case.flops(direction), entry.ms):7.2f} TFLOPS")
    if entry.nbytes:
        rate = gbps(entry.nbytes, entry.ms)
        parts.append(f"{rate:7.1f} GB/s" + (f" {100.0 * rate / copy_rate:5.1f}% of copy" if copy_rate else ""))
    words = entry.text or entry.status
    return f"{head} {', '.join(parts)}  {words}" + (f" ({entry.note})" if entry.note else "")


# ---- options ---------------------------------------------------------------------------------

class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{NAME}: {message}\n")
        sys.exit(2)


def parse_args(argv):
    ap = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--unverified", action="store_true",
                    help="run attnlab's kernels that have not run on a GPU yet (sets ATTNLAB_UNVERIFIED=1 here)")
    ap.add_argument("--parts", default="varlen,decode", help="varlen, decode, or varlen,decode (both: the default)")
    ap.add_argument("--quick", action="store_true", help="small shapes, few iterations")
    ap.add_argument("--no-peers", action="store_true", help="ours and the yardsticks only")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    v = ap.add_argument_group("variable length")
    v.add_argument("--lengths", default=None, help="the sequences' lengths, separated by commas (instead of drawn)")
    v.add_argument("--total", default=None, help="tokens in the batch (default 64K; --quick 8K)")
    v.add_argument("--mean", default=None, help="the lengths' mean (default 2K; --quick 512)")
    v.add_argument("--min-len", default="1")
    v.add_argument("--max-len", default=None, help="default 16K; --quick 2K")
    v.add_argument("--H", default="16")
    v.add_argument("--Hkv", default="0", help="0: H")
    v.add_argument("--D", default="128")
    v.add_argument("--Dv", default="0", help="0: D")
    v.add_argument("--varlen-causal", choices=("both", "yes", "no"), default="both")
    v.add_argument("--no-bwd", action="store_true", help="no backward rows")
    d = ap.add_argument_group("paged decoding")
    d.add_argument("--decode-B", default=None, help="sequences (default 64; --quick 8)")
    d.add_argument("--decode-H", default="32")
    d.add_argument("--decode-Hkv", default="8")
    d.add_argument("--decode-D", default="128", help="D = Dv")
    d.add_argument("--cache-lens", default=None,
                   help="cache lengths, one case each (default 4K,16K,64K,128K; --quick 1K,4K); an item A/B/... "
                        "gives the sequences' lengths in turn")
    d.add_argument("--page-sizes", default="64,256", help="each dividing the largest")
    d.add_argument("--decode-nq", default="1,4", help="new tokens per sequence")
    t = ap.add_argument_group("timing and output")
    t.add_argument("--warmup", type=int, default=None, help="default 3; --quick 1")
    t.add_argument("--iters", type=int, default=None, help="default 20; --quick 5")
    t.add_argument("--seed", type=int, default=0, help="the lengths drawn from it; case k's inputs from seed + k")
    t.add_argument("--no-check", action="store_true", help="timing only")
    t.add_argument("--csv", default=None, help="default: results/<gpu>/varlen.csv")
    t.add_argument("--no-csv", action="store_true")
    t.add_argument("--budget", type=float, default=0,
                   help="seconds after which no further case starts (0: no limit); those left are listed")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.warmup < 0 or args.iters < 1:
        raise BadInput("--warmup must be >= 0 and --iters >= 1")
    args.part_list = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.part_list or any(p not in (VARLEN, DECODE) for p in args.part_list):
        raise BadInput(f"--parts takes varlen, decode or varlen,decode, got '{args.parts}'")
    args.cases = alternate(varlen_cases(args) if VARLEN in args.part_list else [],
                           decode_cases(args) if DECODE in args.part_list else [])
    return args


def alternate(first, second):
    """first[0], second[0], first[1], second[1], ..., then the longer one's rest: a run cut by --budget then has
    rows of both parts."""
    return [c for pair in itertools.zip_longest(first, second) for c in pair if c is not None]


def heads(H, Hkv, what):
    if Hkv == 0:
        Hkv = H
    if H % Hkv:
        raise BadInput(f"{what}: H = {H} is not a multiple of Hkv = {Hkv}")
    return H, Hkv


def varlen_cases(args):
    """The varlen Cases of the options: the lengths (given or drawn), causal and/or not."""
    if args.lengths:
        lengths = parse_list(args.lengths, "--lengths", least=0)
        if sum(lengths) < 1:
            raise BadInput("--lengths must hold at least one token")
    else:
        lengths = draw_lengths(args.seed, parse_size(args.total, "--total"), parse_size(args.mean, "--mean"),
                               parse_size(args.min_len, "--min-len"), parse_size(args.max_len, "--max-len"))
    H, Hkv = heads(parse_size(args.H, "--H"), parse_size(args.Hkv, "--Hkv", 0), "varlen")
    D = parse_size(args.D, "--D")
    Dv = parse_size(args.Dv, "--Dv", 0) or D
    masks = {"both": (True, False), "yes": (True,), "no": (False,)}[args.varlen_causal]
    return [Case(VARLEN, tuple(lengths), H, Hkv, D, Dv, args.dtype, causal) for causal in masks]


def decode_cases(args):
    """The decode Cases of the options, by cache length, then Nq (the largest caches last)."""
    B = parse_size(args.decode_B, "--decode-B")
    H, Hkv = heads(parse_size(args.decode_H, "--decode-H"), parse_size(args.decode_Hkv, "--decode-Hkv", 0), "decode")
    D = parse_size(args.decode_D, "--decode-D")
    page_sizes = tuple(sorted(set(parse_list(args.page_sizes, "--page-sizes"))))
    for p in page_sizes:
        if max(page_sizes) % p:
            raise BadInput(f"--page-sizes: {p} does not divide {max(page_sizes)} (the smaller pages view the "
                           "largest's memory)")
    nqs = parse_list(args.decode_nq, "--decode-nq")
    cases = []
    for spec in parse_cache_cases(args.cache_lens):
        lengths = cache_lengths(spec, B)
        for nq in nqs:
            if min(lengths) < nq:
                raise BadInput(f"--cache-lens {'/'.join(map(str, spec))}: a cache holds its Nq = {nq} new tokens, "
                               f"so it needs at least {nq} keys")
            cases.append(Case(DECODE, lengths, H, Hkv, D, D, args.dtype, True, nq, page_sizes))
    return cases


def main(argv=None):
    try:
        args = parse_args(argv)
    except BadInput as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    if not args.unverified:
        print(f"{NAME}: attnlab's variable-length and paged-decode kernels have not run on a GPU yet; pass "
              "--unverified to run them anyway (their rows are marked unverified)", file=sys.stderr)
        return 2
    os.environ["ATTNLAB_UNVERIFIED"] = "1"  # this process only: attnlab's kernels read it at each call
    try:
        import torch
    except ImportError:
        print(f"{NAME}: torch is not installed", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print(f"{NAME}: no usable GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 3
    try:
        import attnlab
    except Exception as e:  # not built, or built against another torch
        print(f"{NAME}: the attnlab module does not import ({run_info.first_line(e, 100)}); build it and put "
              "build/python on PYTHONPATH", file=sys.stderr)
        return 3
    return Bench(args, torch, attnlab).run()


# ---- the GPU side ----------------------------------------------------------------------------

class Bench:
    """Inputs, references, every row's calls and checks, the timer, the rows."""

    def __init__(self, args, torch, attnlab, device=None):
        from gpu_timing import Timer

        self.args, self.torch, self.attnlab = args, torch, attnlab
        self.device = device or torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference in fp32, not TF32
        self.timer = Timer(torch, self.device)
        self.gpu = torch.cuda.get_device_name()
        versions = run_info.software(torch)
        versions["FlashInfer"] = run_info.package_version("flashinfer-python")
        self.software = run_info.software_line(versions)
        self.fields = run_info.system_fields(self.gpu, versions)
        self.decode_fn = getattr(attnlab, "decode", None) or getattr(attnlab, "paged_decode", None)
        self.first_calls = 0.0
        self.rows = []
        default = os.path.join(ROOT, "results", run_info.gpu_slug(self.gpu), "varlen.csv")
        self.path = None if args.no_csv else args.csv or default
        self.fa4 = self.flashinfer = self.flex = self.create_block_mask = None
        self.absent = {}  # peer -> the line that says why it has no rows
        if args.no_peers:
            print("peers: not run (--no-peers): ours and the yardsticks only")
        else:
            self.find_peers()

    # ---- the peers ------------------------------------------------------------------------
    def find_peers(self):
        """Each peer's entry point, or the one line that says why it is absent."""
        import importlib.util
        torch = self.torch
        try:
            found = importlib.util.find_spec("flash_attn.cute") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            self.absent["fa4"] = f"not installed ({INSTALL['fa4']})"
        else:
            try:
                from flash_attn.cute import flash_attn_varlen_func
                self.fa4 = flash_attn_varlen_func
            except Exception as e:  # a wheel without its DSL libraries: absent all the same
                self.absent["fa4"] = f"flash_attn.cute does not import: {run_info.first_line(e, 100)}"
        try:
            import flashinfer
            self.flashinfer = flashinfer
        except Exception as e:
            self.absent["flashinfer"] = (f"not installed ({INSTALL['flashinfer']})" if isinstance(e, ImportError)
                                         else f"does not import: {run_info.first_line(e, 100)}")
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            for limit in ("recompile_limit", "cache_size_limit"):  # the name differs between torch versions
                if hasattr(torch._dynamo.config, limit):  # each shape and mask compiles anew, forward and backward
                    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 128))
            self.flex = torch.compile(flex_attention, dynamic=False)
            self.create_block_mask = create_block_mask
        except Exception as e:
            self.absent["flex_attention"] = f"not in this torch ({run_info.first_line(e, 100)})"
        if not hasattr(torch, "jagged") or not hasattr(torch.nested, "nested_tensor_from_jagged"):
            self.absent["sdpa nested"] = "this torch has no jagged nested tensors (nested_tensor_from_jagged)"
        for name, why in self.absent.items():
            print(f"{name}: {why}")

    # ---- small helpers --------------------------------------------------------------------
    def dtype(self, case):
        return self.torch.bfloat16 if case.dtype == "bf16" else self.torch.float16

    def first_call(self, entry, call, failure="unsupported"):
        """The row's first call, outside the timing (it compiles what JIT-compiles): its result, or None with the
        row marked `failure` and the reason in its text. Its wall time is printed when over a second."""
        torch = self.torch
        start = time.perf_counter()
        try:
            result = call()
            torch.cuda.synchronize()
        except Exception as e:  # a library's refusal of the shape, or a failure: the row's, not the run's
            entry.status, entry.text, entry.call = failure, run_info.first_line(e) or type(e).__name__, None
            return None
        elapsed = time.perf_counter() - start
        self.first_calls += elapsed
        if elapsed > 1.0:
            print(f"  {entry.name:<32} first call {elapsed:.1f} s (compiles; outside the timing)")
        return result

    def backward_call(self, graph, dout):
        """A timed backward for the timer: (prepare, timed). prepare builds the forward graph (graph() -> (out,
        leaves)), untimed; timed is torch.autograd.grad of out for dout alone."""
        torch = self.torch
        return (graph, lambda g: torch.autograd.grad(g[0], g[1], dout))

    def gradients(self, graph, dout):
        """dQ, dK, dV of out·dout through the graph that graph() builds ((out, leaves))."""
        out, leaves = graph()
        return self.torch.autograd.grad(out, leaves, dout)

    def sdpa_backend(self, q, k, v, causal, gqa, nested):
        """The backend torch's SDPA picks for these inputs, by its own selector (private: None where not found)."""
        torch = self.torch
        try:
            from torch.nn.attention import SDPBackend
            if nested:
                import inspect

                from torch.nested._internal.sdpa import _select_sdp_backend
                extra = [gqa] if len(inspect.signature(_select_sdp_backend).parameters) > 6 else []
                choice = _select_sdp_backend(q, k, v, None, 0.0, causal, *extra)
            else:
                choice = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal, enable_gqa=gqa))
            return choice.name.lower()
        except Exception:
            return None

    # ---- the reference ----------------------------------------------------------------------
    def sequence_attention(self, q, k, v, causal, scale, dtype, dout=None):
        """One sequence's unfused attention, q [nq, H, D], k [nk, Hkv, D], v [nk, Hkv, Dv], in `dtype`'s arithmetic
        (float32: the reference; the inputs' dtype: the yardstick, S rounded to it, the softmax in fp32 and P
        rounded): (out [nq, H, Dv], lse [H, nq] fp32); with dout [nq, H, Dv]: (dq, dk, dv) of out·dout through
        autograd instead. Causal: bottom-right, query i sees key j iff j <= i + nk - nq. The H // Hkv query heads of
        a KV head are one matrix of rows (no copy of K per head); the queries in chunks, so that S stays under
        CHUNK elements. A row that sees no key: out 0, lse -inf."""
        torch = self.torch
        nq, H, D = q.shape
        nk, Hkv, _ = k.shape
        Dv = v.shape[-1]
        group = H // Hkv
        fp32 = dtype == torch.float32
        q, k, v = (t.detach().to(dtype) for t in (q, k, v))
        kh, vh = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, nk, D], [Hkv, nk, Dv]
        rows = max(1, (CHUNK if dout is None else CHUNK // 4) // max(1, H * nk))
        keys = torch.arange(nk, device=q.device)
        if dout is None:
            out = torch.empty(nq, H, Dv, device=q.device, dtype=dtype)
            lse = torch.empty(H, nq, device=q.device, dtype=torch.float32)
        else:
            dq = torch.empty_like(q)
            dk = torch.zeros(nk, Hkv, D, device=q.device, dtype=torch.float32)
            dv = torch.zeros(nk, Hkv, Dv, device=q.device, dtype=torch.float32)
        for i0 in range(0, nq, rows):
            i1 = min(nq, i0 + rows)
            c = i1 - i0
            qc, kl, vl = q[i0:i1], kh, vh
            if dout is not None:
                qc, kl, vl = (t.detach().requires_grad_() for t in (qc, kh, vh))
            with torch.set_grad_enabled(dout is not None):
                qg = qc.permute(1, 0, 2).reshape(Hkv, group * c, D)  # row g·c + i: head hk·group + g, query i0 + i
                s = (qg @ kl.transpose(1, 2)) * scale                # [Hkv, group·c, nk]
                if causal:
                    query = torch.arange(i0, i1, device=q.device).repeat(group)
                    s = s.masked_fill(keys[None, :] > query[:, None] + (nk - nq), -math.inf)
                p = torch.softmax(s, -1) if fp32 else torch.softmax(s.float(), -1).to(dtype)
                o = p.nan_to_num(0.0) @ vl                           # [Hkv, group·c, Dv]
            if dout is None:
                out[i0:i1] = o.reshape(H, c, Dv).permute(1, 0, 2)
                lse[:, i0:i1] = torch.logsumexp(s.float(), -1).reshape(H, c)
                continue
            do = dout[i0:i1].to(dtype).permute(1, 0, 2).reshape(Hkv, group * c, Dv)
            gq, gk, gv = torch.autograd.grad(o, (qc, kl, vl), do)
            dq[i0:i1] = gq
            dk += gk.transpose(0, 1).float()
            dv += gv.transpose(0, 1).float()
            del s, p, o
        if dout is None:
            return out, lse
        return dq, dk.to(dtype), dv.to(dtype)

    def packed_reference(self, case, q, k, v, scale, dout=None):
        """Every sequence of the packed batch through sequence_attention, in fp32 (the reference) and in the inputs'
        dtype (the yardstick), packed as the inputs: forward {"ref": (out, lse), "low": (out, lse)}; with dout
        {"ref": (dq, dk, dv), "low": (dq, dk, dv)}."""
        torch = self.torch
        cu = offsets(case.lengths)
        result = {}
        for label, dtype in (("ref", torch.float32), ("low", self.dtype(case))):
            if dout is None:
                outs = [torch.empty(case.total, case.H, case.Dv, device=self.device, dtype=dtype),
                        torch.full((case.H, case.total), -math.inf, device=self.device)]
            else:
                outs = [torch.empty(case.total, case.H, case.D, device=self.device, dtype=dtype),
                        torch.empty(case.total, case.Hkv, case.D, device=self.device, dtype=dtype),
                        torch.empty(case.total, case.Hkv, case.Dv, device=self.device, dtype=dtype)]
            for b, n in enumerate(case.lengths):
                if n == 0:
                    continue
                s = slice(cu[b], cu[b + 1])
                got = self.sequence_attention(q[s], k[s], v[s], case.causal, scale, dtype,
                                              None if dout is None else dout[s])
                if dout is None:
                    outs[0][s], outs[1][:, s] = got
                else:
                    for o, g in zip(outs, got):
                        o[s] = g
            result[label] = tuple(outs)
        return result

    # ---- the check ---------------------------------------------------------------------------
    def judge_rows(self, got, ref, low, bounds, lse=None, ref_lse=None):
        """[(ok, err, tol, lse_err, b)] of each sequence b with rows: got, ref and low [rows, heads, d], sequence
        b's rows bounds[b] .. bounds[b + 1]; lse and ref_lse [H, rows] where the row returns an LSE. The rule is
        attnlab.judge's: err <= 2 x the yardstick's err + 2 x the reference's rounding, nothing non-finite, the
        LSE within its tolerance."""
        torch = self.torch
        verdicts = []
        for b in range(len(bounds) - 1):
            s = slice(bounds[b], bounds[b + 1])
            if bounds[b + 1] == bounds[b]:
                continue
            g, r = got[s].float(), ref[s].float()
            finite = torch.isfinite(g)
            nonfinite = int((~finite).sum())
            err = float((g - r).abs()[finite].max()) if finite.any() else 0.0
            baseline = float((low[s].float() - r).abs().max())
            rounding = float(((r + 0.3).to(got.dtype).float() - 0.3 - r).abs().max())
            lse_err, lse_bad = 0.0, 0
            if lse is not None and ref_lse is not None:
                gl, rl = lse[:, s].float(), ref_lse[:, s]
                empty = torch.isneginf(rl)
                lse_bad = int((empty & ~torch.isneginf(gl)).sum()) + int((~empty & ~torch.isfinite(gl)).sum())
                both = ~empty & torch.isfinite(gl)
                lse_err = float((gl - rl).abs()[both].max()) if both.any() else 0.0
            ok, tol = self.attnlab.judge(err, nonfinite, lse_err, lse_bad, baseline, rounding)
            if nonfinite:
                err = math.nan
            verdicts.append((bool(ok), err, tol, lse_err if lse is not None else None, b))
        return verdicts

    def verdict(self, entry, checks, count):
        """The row's verdict from [(output name, judge_rows' verdicts)]: FAIL where any sequence failed; err and tol
        those of the sequence nearest its bound (a failing one first); the words name each output's worst."""
        def badness(v):
            ok, err, tol = v[0], v[1], v[2]
            return (not ok, math.inf if not err <= tol else err / max(tol, 1e-30))

        parts, worst = [], None
        for name, verdicts in checks:
            if not verdicts:
                continue
            v = max(verdicts, key=badness)
            ok, err, tol, lse_err, b = v
            text = f"{name} {err:.2e} {'<=' if err <= tol else '>'} {tol:.2e} (#{b})"
            if lse_err is not None:
                text += f", lse {lse_err:.2e}"
            parts.append(text)
            if worst is None or badness(v) > badness(worst):
                worst = v
        if worst is None:
            entry.status, entry.text = "PASS", "PASS (no rows to check)"
            return
        failed = any(not v[0] for _, verdicts in checks for v in verdicts)
        entry.status = "FAIL" if failed else "PASS"
        entry.err, entry.tol = worst[1], worst[2]
        entry.text = f"{entry.status} {', '.join(parts)}; worst of {count} sequences"

    def check_forward(self, entry, ref, out, bounds, lse=None):
        """The forward check of a row whose output is packed [rows, H, Dv] (lse [H, rows] or None)."""
        if ref is None:
            return
        ref_out, ref_lse = ref["ref"]
        checks = [("O", self.judge_rows(out, ref_out, ref["low"][0], bounds, lse,
                                        ref_lse if lse is not None else None))]
        self.verdict(entry, checks, len(bounds) - 1)

    def check_backward(self, entry, gref, grads, bounds):
        """The backward check of a row whose dq, dk, dv are packed as q, k, v."""
        if gref is None:
            return
        checks = [(name, self.judge_rows(g, r, lo, bounds))
                  for name, g, r, lo in zip(("dQ", "dK", "dV"), grads, gref["ref"], gref["low"])]
        self.verdict(entry, checks, len(bounds) - 1)

    # ---- variable length ---------------------------------------------------------------------
    def varlen(self, case, seed):
        """The varlen rows of one case: forward, then backward."""
        torch = self.torch
        dtype = self.dtype(case)
        g = torch.Generator(device=self.device).manual_seed(seed)

        def normal(*size):
            return torch.randn(*size, generator=g, device=self.device, dtype=dtype)

        x = Inputs()
        x.q, x.k, x.v = normal(case.total, case.H, case.D), normal(case.total, case.Hkv, case.D), \
            normal(case.total, case.Hkv, case.Dv)
        x.dout = normal(case.total, case.H, case.Dv)
        x.bounds = offsets(case.lengths)
        x.cu = torch.tensor(x.bounds, dtype=torch.int32, device=self.device)
        x.offsets = x.cu.long()  # one tensor for every nested view: q, k and v then share their ragged size
        x.maxlen, x.scale, x.gqa = case.longest, 1.0 / math.sqrt(case.D), case.Hkv != case.H
        check = not self.args.no_check

        ref = self.packed_reference(case, x.q, x.k, x.v, x.scale) if check else None
        entries = [self.ours_varlen(case, x, ref)]
        if not self.args.no_peers:
            entries += [self.fa4_varlen(case, x, ref), self.nested_varlen(case, x, ref),
                        self.flex_varlen(case, x, ref)]
        entries.append(self.padded_varlen(case, x, ref))
        del ref
        self.finish(case, FWD, [e for e in entries if e], seed)
        if self.args.no_bwd:
            return
        gref = self.packed_reference(case, x.q, x.k, x.v, x.scale, x.dout) if check else None
        entries = [self.ours_varlen(case, x, gref, backward=True)]
        if not self.args.no_peers:
            entries += [self.fa4_varlen(case, x, gref, backward=True), self.nested_varlen(case, x, gref, True),
                        self.flex_varlen(case, x, gref, backward=True)]
        entries.append(self.padded_varlen(case, x, gref, backward=True))
        del gref
        self.finish(case, BWD, [e for e in entries if e], seed)

    def ours_varlen(self, case, x, ref, backward=False):
        fn = self.attnlab.varlen_attention
        entry = Entry(OURS_VARLEN + (" bwd" if backward else ""), OURS, unverified=True)

        def forward(q, k, v, checked=False, lse=False):
            return fn(q, k, v, x.cu, x.cu, x.maxlen, x.maxlen, is_causal=case.causal, scale=x.scale,
                      return_lse=lse, check_seqlens=checked)

        if backward:
            def graph(checked=False):
                leaves = [t.detach().requires_grad_() for t in (x.q, x.k, x.v)]
                return forward(*leaves, checked=checked), leaves

            grads = self.first_call(entry, lambda: self.gradients(lambda: graph(True), x.dout), "error")
            if grads is not None:
                self.check_backward(entry, ref, grads, x.bounds)
                entry.call = self.backward_call(graph, x.dout)
            return entry
        r = self.first_call(entry, lambda: forward(x.q, x.k, x.v, checked=True, lse=True), "error")
        if r is not None:
            self.check_forward(entry, ref, r[0], x.bounds, r[1])
            entry.call = lambda: forward(x.q, x.k, x.v)
        return entry

    def fa4_varlen(self, case, x, ref, backward=False):
        """FlashAttention-4's flash_attn_varlen_func on the packed batch (its own layout, ours)."""
        if self.fa4 is None:
            return None
        import inspect
        fa4 = self.fa4
        entry = Entry(FA4_VARLEN + (" bwd" if backward else ""), PEER)
        kw = dict(cu_seqlens_q=x.cu, cu_seqlens_k=x.cu, max_seqlen_q=x.maxlen, max_seqlen_k=x.maxlen,
                  softmax_scale=x.scale, causal=case.causal)
        with_lse = "return_lse" in inspect.signature(fa4).parameters

        def forward(q, k, v, lse=False):
            r = fa4(q, k, v, **kw, **({"return_lse": True} if lse and with_lse else {}))
            return (r[0], r[1]) if isinstance(r, tuple) else (r, None)

        if backward:
            def graph():
                leaves = [t.detach().requires_grad_() for t in (x.q, x.k, x.v)]
                return forward(*leaves)[0], leaves

            grads = self.first_call(entry, lambda: self.gradients(graph, x.dout))
            if grads is not None:
                self.check_backward(entry, ref, grads, x.bounds)
                entry.call = self.backward_call(graph, x.dout)
            return entry
        r = self.first_call(entry, lambda: forward(x.q, x.k, x.v, lse=True))
        if r is not None:
            out, lse = r
            shaped = lse is not None and tuple(lse.shape) == (case.H, case.total)
            self.check_forward(entry, ref, out, x.bounds, lse if shaped else None)
            entry.call = lambda: forward(x.q, x.k, x.v)
        return entry

    def nested(self, packed, x, case):
        """A jagged nested tensor [B, j, heads, d] viewing the packed rows (no copy; differentiable in them), its
        shortest and longest lengths given so that no call reads them back from the GPU."""
        import inspect
        make = self.torch.nested.nested_tensor_from_jagged
        extra = {}
        if "max_seqlen" in inspect.signature(make).parameters:
            extra = {"min_seqlen": min(case.lengths), "max_seqlen": case.longest}
        return make(packed, x.offsets, **extra)

    def nested_varlen(self, case, x, ref, backward=False):
        """torch SDPA on jagged nested tensors transposed to [B, H, j, D]; the note names the backend."""
        if "sdpa nested" in self.absent:
            return None
        torch = self.torch
        F = torch.nn.functional
        entry = Entry(SDPA_NESTED + (" bwd" if backward else ""), PEER)
        gqa = {"enable_gqa": True} if x.gqa else {}

        def forward(q, k, v):
            qn, kn, vn = (self.nested(t, x, case).transpose(1, 2) for t in (q, k, v))
            return F.scaled_dot_product_attention(qn, kn, vn, is_causal=case.causal, scale=x.scale, **gqa)

        def packed_out(out):
            return out.transpose(1, 2).values()

        try:
            views = [self.nested(t, x, case).transpose(1, 2) for t in (x.q, x.k, x.v)]
            backend = self.sdpa_backend(*views, case.causal, x.gqa, nested=True)
        except Exception:
            views, backend = None, None
        entry.note = f"torch picks {backend}" if backend else "torch's backend not named (its selector not found)"
        if backward:
            def graph():
                leaves = [t.detach().requires_grad_() for t in (x.q, x.k, x.v)]
                return packed_out(forward(*leaves)), leaves

            grads = self.first_call(entry, lambda: self.gradients(graph, x.dout))
            if grads is not None:
                self.check_backward(entry, ref, grads, x.bounds)
                entry.call = self.backward_call(graph, x.dout)
            return entry
        out = self.first_call(entry, lambda: packed_out(forward(x.q, x.k, x.v)))
        if out is not None:
            self.check_forward(entry, ref, out, x.bounds)
            if views:  # the nested views made once: the timed call is SDPA's alone
                qn, kn, vn = views
                entry.call = lambda: F.scaled_dot_product_attention(qn, kn, vn, is_causal=case.causal,
                                                                    scale=x.scale, **gqa)
            else:
                entry.call = lambda: forward(x.q, x.k, x.v)
        return entry

    def flex_varlen(self, case, x, ref, backward=False):
        """Compiled flex_attention on the packed batch as one sequence [1, H, total, D] with a document block mask."""
        if self.flex is None:
            return None
        entry = Entry(FLEX_DOCUMENT + (" bwd" if backward else ""), PEER)
        if x.flex is None:
            try:
                x.flex = self.document_mask(case, x)
            except Exception as e:
                x.flex = run_info.first_line(e) or type(e).__name__
        if isinstance(x.flex, str):
            entry.status, entry.text = "unsupported", f"its block mask: {x.flex}"
            return entry
        block_mask, sparsity = x.flex
        entry.note = f"document block mask ({sparsity:.1f}% of blocks empty), built outside the timing"
        gqa = {"enable_gqa": True} if x.gqa else {}

        def flex_layout(t):  # [total, heads, d] -> [1, heads, total, d], contiguous, outside the timing
            return t.transpose(0, 1).contiguous().unsqueeze(0)

        def packed(t):  # [1, heads, total, d] -> [total, heads, d]
            return t.squeeze(0).transpose(0, 1)

        qf, kf, vf = (flex_layout(t) for t in (x.q, x.k, x.v))

        def forward(q, k, v):
            return self.flex(q, k, v, block_mask=block_mask, scale=x.scale, **gqa)

        if backward:
            dout = flex_layout(x.dout)

            def graph():
                leaves = [t.detach().requires_grad_() for t in (qf, kf, vf)]
                return forward(*leaves), leaves

            grads = self.first_call(entry, lambda: self.gradients(graph, dout))
            if grads is not None:
                self.check_backward(entry, ref, [packed(t) for t in grads], x.bounds)
                entry.call = self.backward_call(graph, dout)
            return entry
        out = self.first_call(entry, lambda: forward(qf, kf, vf))
        if out is not None:
            self.check_forward(entry, ref, packed(out), x.bounds)
            entry.call = lambda: forward(qf, kf, vf)
        return entry

    def document_mask(self, case, x):
        """(BlockMask, % of blocks empty): query and key in the same document (and, causal, the key not after the
        query: within a document, bottom-right and top-left are one mask), over the packed batch."""
        torch = self.torch
        doc = torch.repeat_interleave(torch.arange(case.B, device=self.device, dtype=torch.int32),
                                      torch.tensor(case.lengths, device=self.device))

        def same_document(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]

        def causal_document(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

        make = self.create_block_mask  # evaluates the mask densely: total² booleans at once
        if case.total ** 2 > DENSE_MASK_LIMIT:  # compiled, it works block by block
            make = self.torch.compile(self.create_block_mask)
        start = time.perf_counter()
        block_mask = make(causal_document if case.causal else same_document, None, None, case.total, case.total,
                          device=self.device)
        elapsed = time.perf_counter() - start
        if elapsed > 1.0:
            print(f"  {FLEX_DOCUMENT:<32} its block mask {elapsed:.1f} s (outside the timing)")
        return block_mask, float(block_mask.sparsity())

    def pad(self, packed, case):
        torch = self.torch
        out = torch.zeros(case.B, packed.shape[1], case.longest, packed.shape[2], device=self.device,
                          dtype=packed.dtype)
        cu = offsets(case.lengths)
        for b, n in enumerate(case.lengths):
            out[b, :, :n] = packed[cu[b]:cu[b + 1]].transpose(0, 1)
        return out

    def unpad(self, padded, case):
        torch = self.torch
        return torch.cat([padded[b, :, :n].transpose(0, 1) for b, n in enumerate(case.lengths)], 0)

    def padded_varlen(self, case, x, ref, backward=False):
        """The yardstick: attnlab's dense engine on the padded batch; checked where causal (see the module's text)."""
        attnlab = self.attnlab
        entry = Entry(PADDED + (" bwd" if backward else ""), YARDSTICK)
        if x.padded is None:  # q, k, v and dO padded with zeros to [B, heads, longest, d], attnlab's dense layout
            try:
                x.padded = [self.pad(t, case) for t in (x.q, x.k, x.v, x.dout)]
            except Exception as e:  # memory: B x the longest sequence may be far more than the packed batch
                x.padded = f"the padded batch: {run_info.first_line(e)}"
        if isinstance(x.padded, str):
            entry.status, entry.text = "unsupported", x.padded
            return entry
        qp, kp, vp, dp = x.padded
        exact = case.causal
        if not exact:
            ref = None
        try:
            variant = (attnlab.backward_variant if backward else attnlab.default_variant)(qp, kp, vp, case.causal,
                                                                                          x.gqa)
            entry.note = ("backward " if backward else "") + variant
        except Exception as e:  # no kernel runs the padded shape
            entry.status, entry.text = "unsupported", run_info.first_line(e)
            return entry
        entry.note += f" on B={case.B} x {case.longest} rows; TFLOPS on the packed batch's pairs"
        if not exact:
            entry.note += "; timed only (not causal, its rows attend the padding keys)"
        if backward:
            def graph():
                leaves = [t.detach().requires_grad_() for t in (qp, kp, vp)]
                return attnlab.attention(*leaves, is_causal=case.causal, scale=x.scale, enable_gqa=x.gqa), leaves

            grads = self.first_call(entry, lambda: self.gradients(graph, dp), "error")
            if grads is not None:
                self.check_backward(entry, ref, [self.unpad(t, case) for t in grads], x.bounds)
                entry.call = self.backward_call(graph, dp)
            return entry

        def forward():
            return attnlab.forward(qp, kp, vp, variant=variant, is_causal=case.causal, scale=x.scale,
                                   enable_gqa=x.gqa)

        r = self.first_call(entry, forward, "error")
        if r is not None:
            self.check_forward(entry, ref, self.unpad(r[0], case), x.bounds)
            entry.call = forward
        return entry

    # ---- paged decoding ----------------------------------------------------------------------
    def decode(self, case, seed):
        """The decode rows of one case, or None (and one line) where its cache does not fit."""
        torch = self.torch
        free, _ = torch.cuda.mem_get_info()
        paged_bytes, contiguous_bytes = decode_memory(case)
        if paged_bytes + MEMORY_MARGIN > free:
            print(f"  not run: the paged cache takes {paged_bytes / 2**30:.1f} GiB, "
                  f"{free / 2**30:.1f} GiB free (less {MEMORY_MARGIN >> 30} GiB of room)")
            return
        dtype = self.dtype(case)
        g = torch.Generator(device=self.device).manual_seed(seed)
        big = max(case.page_sizes)
        table, num_pages = block_table(case.lengths, big, seed)
        x = Inputs()
        x.k_cache = torch.randn(num_pages, big, case.Hkv, case.D, generator=g, device=self.device, dtype=dtype)
        x.v_cache = torch.randn(num_pages, big, case.Hkv, case.Dv, generator=g, device=self.device, dtype=dtype)
        x.q = torch.randn(case.B, case.Nq, case.H, case.D, generator=g, device=self.device, dtype=dtype)
        x.seqlens = torch.tensor(case.lengths, dtype=torch.int32, device=self.device)
        x.scale = 1.0 / math.sqrt(case.D)
        x.tables, x.caches = {}, {}
        for p in case.page_sizes:  # each page size views the same memory through its own table
            rows = split_table(table, case.lengths, big, p)
            x.tables[p] = (rows, torch.tensor(rows, dtype=torch.int32, device=self.device))
            x.caches[p] = (x.k_cache.view(-1, p, case.Hkv, case.D), x.v_cache.view(-1, p, case.Hkv, case.Dv))
        x.big = big
        x.bounds = [b * case.Nq for b in range(case.B + 1)]
        ref = self.decode_reference(case, x) if not self.args.no_check else None

        entries = [self.ours_decode(case, x, ref, p) for p in case.page_sizes]
        if not self.args.no_peers:
            entries += self.fa4_paged(case, x, ref)
            entries += self.flashinfer_paged(case, x, ref)
            torch.cuda.empty_cache()  # the reference's blocks back to the driver, so that they count as free
            free, _ = torch.cuda.mem_get_info()
            if contiguous_bytes + MEMORY_MARGIN > free:
                print(f"  {FLEX_CONTIGUOUS} and {SDPA_CONTIGUOUS}: not run (the contiguous copy takes "
                      f"{contiguous_bytes / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free)")
            else:
                self.gather_contiguous(case, x)
                entries += [self.flex_contiguous(case, x, ref), self.sdpa_contiguous(case, x, ref)]
        entries.append(self.copy_entry())
        self.finish(case, FWD, [e for e in entries if e], seed)

    def sequence_cache(self, case, x, b):
        """Sequence b's K and V [L, Hkv, D], gathered through its row of the largest pages' table."""
        n = case.lengths[b]
        pages = x.tables[x.big][0][b][:pages_for(n, x.big)]
        index = self.torch.tensor(pages, device=self.device, dtype=self.torch.long)
        return (x.k_cache[index].reshape(-1, case.Hkv, case.D)[:n],
                x.v_cache[index].reshape(-1, case.Hkv, case.Dv)[:n])

    def decode_reference(self, case, x):
        """{"ref": (out, lse), "low": (out, lse)}, out [B·Nq, H, Dv] and lse [H, B·Nq] (the rows of sequence b at
        b·Nq), each sequence against its own cache gathered through the table."""
        torch = self.torch
        rows = case.B * case.Nq
        result = {}
        for label, dtype in (("ref", torch.float32), ("low", self.dtype(case))):
            out = torch.empty(rows, case.H, case.Dv, device=self.device, dtype=dtype)
            lse = torch.empty(case.H, rows, device=self.device)
            for b in range(case.B):
                k, v = self.sequence_cache(case, x, b)
                s = slice(b * case.Nq, (b + 1) * case.Nq)
                out[s], lse[:, s] = self.sequence_attention(x.q[b], k, v, case.causal, x.scale, dtype)
            result[label] = (out, lse)
        return result

    def check_decode(self, entry, ref, out, lse=None):
        """out [B, Nq, H, Dv] and lse [B, H, Nq] (or None) against the reference, sequence by sequence."""
        if ref is None:
            return
        B, Nq = out.shape[0], out.shape[1]
        packed_lse = None if lse is None else lse.permute(1, 0, 2).reshape(lse.shape[1], B * Nq)
        self.check_forward(entry, ref, out.reshape(B * Nq, out.shape[2], out.shape[3]),
                           [b * Nq for b in range(B + 1)], packed_lse)

    def ours_decode(self, case, x, ref, page):
        import inspect
        fn = self.decode_fn
        entry = Entry(OURS_DECODE, OURS, page_size=page, unverified=True, nbytes=case.bytes)
        if fn is None:
            entry.status, entry.text = "error", "this attnlab has neither decode nor paged_decode"
            return entry
        k_cache, v_cache = x.caches[page]
        table = x.tables[page][1]
        takes = inspect.signature(fn).parameters

        def call(checked=False, lse=False):
            extra = {"check_tables": checked} if "check_tables" in takes else {}
            return fn(x.q, k_cache, v_cache, table, x.seqlens, is_causal=case.causal, scale=x.scale,
                      return_lse=lse, **extra)

        r = self.first_call(entry, lambda: call(checked=True, lse=True), "error")
        if r is not None:
            self.check_decode(entry, ref, r[0], r[1])
            entry.call = call
        return entry

    def fa4_paged(self, case, x, ref):
        """FlashAttention-4 on the paged cache (page_table, seqused_k), a row per page size, or one line."""
        if self.fa4 is None:
            return []
        import inspect
        if "page_table" not in inspect.signature(self.fa4).parameters:
            print(f"  {FA4_PAGED}: this flash-attn-4's flash_attn_varlen_func takes no page_table")
            return []
        entries = []
        for page in case.page_sizes:
            entry = Entry(FA4_PAGED, PEER, page_size=page, nbytes=case.bytes)
            k_cache, v_cache = x.caches[page]
            table = x.tables[page][1]

            def call(k_cache=k_cache, v_cache=v_cache, table=table):
                r = self.fa4(x.q, k_cache, v_cache, seqused_k=x.seqlens, page_table=table, softmax_scale=x.scale,
                             causal=case.causal)
                return r[0] if isinstance(r, tuple) else r

            out = self.first_call(entry, call)
            if out is not None:
                self.check_decode(entry, ref, out)
                entry.call = call
            entries.append(entry)
        return entries

    def flashinfer_paged(self, case, x, ref):
        """FlashInfer's paged decode (Nq = 1) or paged prefill (Nq > 1, causal), planned outside the timing."""
        if self.flashinfer is None:
            return []
        import inspect
        torch = self.torch
        fi = self.flashinfer
        dtype = self.dtype(case)
        entries = []
        for page in case.page_sizes:
            entry = Entry(FLASHINFER_PAGED, PEER, page_size=page, nbytes=case.bytes,
                          note="planned once outside the timing")
            indptr, indices, last = csr_pages(x.tables[page][0], case.lengths, page)

            def device(values):
                return torch.tensor(values, dtype=torch.int32, device=self.device)

            def setup(page=page, indptr=indptr, indices=indices, last=last):
                workspace = torch.zeros(FLASHINFER_WORKSPACE, dtype=torch.uint8, device=self.device)
                if case.Nq == 1:
                    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
                    head = [device(indptr), device(indices), device(last)]
                else:
                    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
                    head = [device(offsets([case.Nq] * case.B)), device(indptr), device(indices), device(last)]
                takes = inspect.signature(wrapper.plan).parameters
                extra = {"q_data_type": dtype, "kv_data_type": dtype} if "q_data_type" in takes else \
                    {"data_type": dtype} if "data_type" in takes else {}
                if "sm_scale" in takes:
                    extra["sm_scale"] = x.scale
                if case.Nq > 1:
                    if "causal" not in takes:
                        raise ValueError("this FlashInfer's prefill plan() takes no causal")
                    extra["causal"] = case.causal
                wrapper.plan(*head, case.H, case.Hkv, case.D, page, **extra)
                q = x.q[:, 0].contiguous() if case.Nq == 1 else x.q.reshape(case.B * case.Nq, case.H, case.D)
                cache = x.caches[page]
                return lambda: wrapper.run(q, cache)

            run = self.first_call(entry, setup)
            out = self.first_call(entry, run) if run is not None else None
            if out is not None:
                self.check_decode(entry, ref, out.reshape(case.B, case.Nq, case.H, case.Dv))
                entry.call = run
            entries.append(entry)
        return entries

    def gather_contiguous(self, case, x):
        """The caches gathered to contiguous [B, Hkv, longest, D] (zero past a shorter cache), outside the timing."""
        torch = self.torch
        x.k_dense = torch.zeros(case.B, case.Hkv, case.longest, case.D, device=self.device, dtype=x.q.dtype)
        x.v_dense = torch.zeros(case.B, case.Hkv, case.longest, case.Dv, device=self.device, dtype=x.q.dtype)
        for b in range(case.B):
            k, v = self.sequence_cache(case, x, b)
            x.k_dense[b, :, :case.lengths[b]] = k.transpose(0, 1)
            x.v_dense[b, :, :case.lengths[b]] = v.transpose(0, 1)
        x.q_dense = x.q.transpose(1, 2).contiguous()  # [B, H, Nq, D]

    def flex_contiguous(self, case, x, ref):
        """Compiled flex_attention on the contiguous cache: GQA, the bottom-right causal mask of each cache."""
        if self.flex is None:
            return None
        entry = Entry(FLEX_CONTIGUOUS, PEER, nbytes=case.bytes,
                      note="on the cache gathered to contiguous [B Hkv L D] (the gather not timed)")
        nq, longest = case.Nq, case.longest
        try:
            if len(set(case.lengths)) == 1:
                shift = longest - nq

                def mask_mod(b, h, q_idx, kv_idx):
                    return kv_idx <= q_idx + shift

                batch = None
            else:
                lengths = x.seqlens

                def mask_mod(b, h, q_idx, kv_idx):
                    return (kv_idx < lengths[b]) & (kv_idx <= q_idx + lengths[b] - nq)

                batch = case.B
            block_mask = self.create_block_mask(mask_mod, batch, None, nq, longest, device=self.device)
        except Exception as e:
            entry.status, entry.text = "unsupported", f"its block mask: {run_info.first_line(e)}"
            return entry

        def call():
            return self.flex(x.q_dense, x.k_dense, x.v_dense, block_mask=block_mask, scale=x.scale,
                             enable_gqa=case.Hkv != case.H)

        out = self.first_call(entry, call)
        if out is not None:
            self.check_decode(entry, ref, out.transpose(1, 2))
            entry.call = call
        return entry

    def sdpa_contiguous(self, case, x, ref):
        """torch SDPA on the contiguous cache, Nq = 1 and one cache length (its one query sees every key: no mask)."""
        if case.Nq != 1 or len(set(case.lengths)) != 1:
            print(f"  {SDPA_CONTIGUOUS}: not run (Nq = 1 and one cache length only: its causal mask is top-left "
                  "aligned and it takes no lengths)")
            return None
        torch = self.torch
        F = torch.nn.functional
        gqa = case.Hkv != case.H
        entry = Entry(SDPA_CONTIGUOUS, PEER, nbytes=case.bytes,
                      note="on the cache gathered to contiguous [B Hkv L D] (the gather not timed)")

        def call():
            return F.scaled_dot_product_attention(x.q_dense, x.k_dense, x.v_dense, scale=x.scale, enable_gqa=gqa)

        backend = self.sdpa_backend(x.q_dense, x.k_dense, x.v_dense, False, gqa, nested=False)
        entry.note += f"; torch picks {backend}" if backend else "; torch's backend not named"
        out = self.first_call(entry, call)
        if out is not None:
            self.check_decode(entry, ref, out.transpose(1, 2))
            entry.call = call
        return entry

    def copy_entry(self):
        """The yardstick of memory bandwidth: dst.copy_(src), 1 GiB (halved where that does not fit)."""
        torch = self.torch
        free, _ = torch.cuda.mem_get_info()
        size = COPY_BYTES
        while size > COPY_LEAST and 2 * size > free // 2:
            size //= 2
        entry = Entry(COPY, YARDSTICK, nbytes=2 * size, note=f"{size / 2**20:.0f} MiB read and written")
        src = self.first_call(entry, lambda: torch.full((size,), 0x3C, dtype=torch.uint8, device=self.device),
                              "error")
        if src is not None:
            dst = torch.empty_like(src)
            entry.call = lambda: dst.copy_(src)
        return entry

    # ---- timing and the rows -----------------------------------------------------------------
    def finish(self, case, direction, entries, seed):
        """Time every entry with a call, interleaved; print the table; keep and append the rows."""
        timed = [e for e in entries if e.call is not None]
        if timed:
            times, errors = self.timer.time_interleaved([e.call for e in timed], self.args.warmup,
                                                        self.args.iters)
            for e, ms, error in zip(timed, times, errors):
                if error:
                    e.status, e.text = "error", error
                else:
                    e.ms = ms
        copy = next((e for e in entries if e.name == COPY and e.ms), None)
        copy_rate = gbps(copy.nbytes, copy.ms) if copy else None
        rows = []
        for e in entries:
            print(table_line(e, case, direction, copy_rate))
            rows.append(csv_row(self.fields, case, direction, e, seed, self.software, copy_rate))
        self.print_ratios(entries)
        if self.path:
            append_rows(self.path, rows)  # case by case: a run cut short keeps what it measured
        self.rows += rows

    def print_ratios(self, entries):
        """For each of our rows that ran: how it compares with the fastest peer that ran and did not fail."""
        peers = [e for e in entries if e.kind == PEER and e.ms and e.status != "FAIL"]
        if not peers:
            return
        best = min(peers, key=lambda e: e.ms)
        for e in entries:
            if e.kind == OURS and e.ms:
                ours = e.name + (f" (pages of {e.page_size})" if e.page_size else "")
                theirs = best.name + (f" (pages of {best.page_size})" if best.page_size else "")
                print(f"  {ours}: {best.ms / e.ms:.2f}x the speed of the fastest peer, {theirs}")

    def run(self):
        args = self.args
        if self.path and (why := check_csv(self.path)):
            print(f"{NAME}: {why}", file=sys.stderr)
            return 2
        print(f"variable length and paged decoding on {self.gpu}; software: {self.software}")
        started, left = time.perf_counter(), []
        for n, case in enumerate(args.cases):
            if args.budget and time.perf_counter() - started > args.budget:
                left.append(case)
                continue
            seed = args.seed + n
            what = "varlen forward and backward" if case.part == VARLEN and not args.no_bwd else case.part
            print(f"---- {what}: {case.describe()}; Warmup: {args.warmup}, Iters: {args.iters}, Seed: {seed}"
                  f"{', unchecked' if args.no_check else ''}")
            (self.varlen if case.part == VARLEN else self.decode)(case, seed)
            self.torch.cuda.empty_cache()
        for case in left:
            print(f"not run (past --budget {args.budget:g} s): {case.part}: {case.describe()}")
        print(f"{len(self.rows)} rows{' -> ' + os.path.relpath(self.path, ROOT) if self.path else ''}; first calls "
              f"(compiles among them) {self.first_calls:.1f} s in all, outside the timing")
        return 1 if any(r["pass"] == "FAIL" or r["kind"] == OURS and r["pass"] == "error" for r in self.rows) else 0


class Inputs:
    """A case's tensors, named as they are made; what is built on first use starts as None."""
    flex = None    # the document block mask (BlockMask, % of blocks empty), or why it could not be built
    padded = None  # q, k, v and dO padded to [B, heads, longest, d], or why they could not be made


if __name__ == "__main__":
    sys.exit(main())
