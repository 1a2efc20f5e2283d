#!/usr/bin/env python3
"""Ratios in a rung page's prose, checked against the page's generated table.

    python3 scripts/prose_ratios.py [results/H200] [docs/*.md]

A rung's page holds a generated table (`<!-- numbers: RUNG prev=PREV -->`,
doc_tables.py) and, in its prose, sentences such as "1.16× at D = 64" or
"0.50–0.64 (the last column)". Each such ratio is checked against the ratios
the table's rows give for what the sentence compares, on the rows it speaks
of, and fails when it lies outside their range (at the ratio's own precision,
from the table's two decimals rounded half up, as a reader rounds):

  - a ratio is "X×", "X–Y×", or a range "X.XX–Y.YY" of two-decimal numbers not
    followed by a unit; either orientation passes ("cuDNN is 1.4× faster"
    reads the table's 0.71 the other way up).
  - what it compares: the name nearest before it (else the first after it) in
    its clause (the text between commas, semicolons, colons, brackets, or an
    "and" before another ratio), else
    in the brackets around it, else in its sentence outside other brackets. FlashAttention-2 / FA2 /
    sdpa(flash): over sdpa(flash) (a backward page: sdpa(flash) bwd); cuDNN /
    sdpa(cudnn): over sdpa(cudnn); "best peer": over the best peer; the rung it
    grows from ("rung 02", "best split-q"): over that rung's best. A ratio
    whose nearest name is something else (another rung, a stage, unfused,
    ping-pong, ...) is not checked; one with no name anywhere in its sentence
    is checked against every ratio of the table.
  - which rows: the qualifiers of its clause: "D = 64", "D = 128 and 256",
    "D ≤ 64", "N = 8192", "causal", "dense" / "non-causal", "causal or not",
    "short" (Nq < Nk), "GQA". A clause without "D = ..." keeps the head dims of
    the clause before it, and a clause with no qualifier ("(0.93×)") reads the
    qualifiers of the clause just before it; a semicolon ends both. The ratio
    passes if it lies in the range of either reading, with what is carried
    over or with its clause's own qualifiers alone.
  - a sentence that cites another source (the sweep, another CSV,
    docs/experiments.md, a median) or counts FLOPs is not checked.

Generated blocks, code, headings and table lines are not prose. The check does
not understand a sentence; it catches the common slip, a number left behind
when the table moved. scripts/regenerate.py --check runs it on every page.
"""
import argparse
import os
import re
import sys
from collections import namedtuple
from decimal import ROUND_HALF_UP, Decimal

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_tables  # noqa: E402
import ladder  # noqa: E402
import results_csv as rc  # noqa: E402

Ratio = namedtuple("Ratio", "kind D Nq Nk causal gqa value")
Problem = namedtuple("Problem", "page text claim kind lo hi")

PREV, FLASH, CUDNN, PEER, OTHER = "previous rung", "sdpa(flash)", "sdpa(cudnn)", "best peer", "other"

NUM = r"\d+\.\d+"
RATIO = re.compile(rf"(?<![\w.])(?P<lo>{NUM})(?:\s*[–-]\s*(?P<hi>{NUM}))?(?P<x>\s*×)?")
# What follows a number that is not a ratio: a percent sign or a unit.
UNIT_AFTER = re.compile(r"\s*(%|(ms|µs|us|ns|s|KiB|MiB|GiB|KB|MB|GB|B|bytes|TFLOPS|MFLOP|GB/s|TB/s|clocks?|"
                        r"registers)\b)")
BEGIN_LINE = re.compile(r"^<!-- (?:[\w-]+:begin|numbers: .*|dmattn-table: .*) -->$")
END_LINE = re.compile(r"^<!-- [\w-]+:end -->$")
NAME_BRACKETS = re.compile(r"(\w)\(([\w-]+)\)")
# A sentence ends at ". " (or "!", "?") but after an abbreviation.
SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<!\bcf\.)(?<=[.!?])\s+")
# Clauses end at punctuation, and at an "and" before another ratio ("0.81× dense and 0.98× causal").
CLAUSE_STOP = re.compile(r"[,;()\[\]:]|\band(?=\s+\d+\.\d)")
D_QUALIFIER = re.compile(r"\bD\s*(=|≤|<=|≥|>=|<|>)\s*(\d+(?:\s*(?:,|and|or|–|-)\s*\d+)*)")
QUALIFIER_WORDS = re.compile(r"\b(D|N|Nq|Nk)\s*(=|≤|<=|≥|>=|<|>)|causal|\bdense\b|\bshort\b|\bGQA\b", re.I)
N_QUALIFIER = re.compile(r"\b(N|Nq|Nk)\s*=\s*(\d+)")
# A sentence that cites another source than the table (the sweep over N, another
# CSV, the experiments log) or counts FLOPs is not checked against the table.
OTHER_SOURCE = re.compile(r"\bsweep\b|\bmedian\b|\.csv\b|experiments\.md|\bFLOPs\b")


def kind_patterns(prev):
    """[(kind, compiled pattern)] of the names that say what a ratio compares."""
    pats = [(FLASH, r"FlashAttention-2|\bFA2\b|sdpa⟨flash⟩"), (CUDNN, r"cuDNN|sdpa⟨cudnn⟩"),
            (PEER, r"best[- ]peer")]
    number = next((r.number for r in ladder.RUNGS if r.prefix == prev), None) if prev else None
    if prev:
        pats.append((PREV, rf"best {re.escape(prev)}\b|`{re.escape(prev)}\S*`" +
                     (rf"|\b[Rr]ung {number}\b" if number else "")))
    pats.append((OTHER, r"\b[Rr]ungs? \d\d\b|\bunfused\b|FlashAttention-3|\bFA3\b|\bstage\d|overlap|ping-pong|"
                        r"deterministic|padded|swizzle|sdpa⟨efficient⟩"))
    return [(k, re.compile(p)) for k, p in pats]


def table_ratios(rows, rung, prev, backward):
    """Every ratio the rung's table gives: [Ratio] over the shapes it lists."""
    bwd = ladder.BWD if backward else ""
    shapes, _ = doc_tables.table_shapes(rows, rung)
    out = []
    for shape in shapes:
        at = [r for r in rows if doc_tables.shape_of(r) == shape]
        B, H, Hkv, Nq, Nk, D, Dv, dtype, causal = shape
        mine, peer, before = doc_tables.best_of(at, rung), rc.best(at, rc.PEER), prev and doc_tables.best_of(at, prev)
        theirs = {PEER: peer and peer["tflops"], FLASH: rc.tflops(at, ladder.FA2 + bwd),
                  CUDNN: rc.tflops(at, ladder.CUDNN + bwd), PREV: before and before["tflops"]}
        for kind, value in theirs.items():
            if value:
                out.append(Ratio(kind, D, Nq, Nk, bool(causal), Hkv != H, mine["tflops"] / value))
    return out


def prose(text):
    """The page's prose as paragraphs (strings), without generated blocks, code, headings or tables."""
    paras, para, in_block, in_code = [], [], False, False
    for line in text.split("\n"):
        stripped = line.strip()
        if in_block:
            in_block = not END_LINE.match(line)
            continue
        if stripped.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if BEGIN_LINE.match(line):
            in_block = True
        if not stripped or BEGIN_LINE.match(line) or stripped.startswith(("|", "#", "<!--")):
            if para:
                paras.append(" ".join(para))
            para = []
            continue
        para.append(stripped)
    if para:
        paras.append(" ".join(para))
    return paras


def claims(sentence):
    """[(match, low, high)] of the ratios a sentence states."""
    found = []
    for m in RATIO.finditer(sentence):
        lo, hi = m.group("lo"), m.group("hi")
        if not m.group("x"):
            two_decimals = hi and len(lo.split(".")[1]) == 2 and len(hi.split(".")[1]) == 2
            if not two_decimals or UNIT_AFTER.match(sentence, m.end()):
                continue
        found.append((m, lo, hi or lo))
    return found


def clauses(sentence):
    """[(start, end)] of the sentence's clauses: the text between commas, semicolons, colons or brackets."""
    cuts = [0] + [m.start() for m in CLAUSE_STOP.finditer(sentence)] + [len(sentence)]
    return list(zip(cuts, cuts[1:]))


def outside_brackets(sentence, at):
    """`sentence` with the bracketed asides blanked out, but for the brackets around position `at`."""
    out, depth, opened = list(sentence), 0, []
    for i, c in enumerate(sentence):
        if c == "(":
            opened.append(i)
        elif c == ")" and opened:
            start = opened.pop()
            if not opened and not start < at < i:
                out[start:i + 1] = " " * (i + 1 - start)
    return "".join(out)


def own_bracket(sentence, at):
    """(start, end) of the innermost bracketed aside around position `at`, or an empty span."""
    opened = []
    for i, c in enumerate(sentence):
        if c == "(":
            opened.append(i)
        elif c == ")" and opened:
            start = opened.pop()
            if start < at < i:
                return start, i + 1
    return at, at


def kind_in(text, start, patterns):
    """The nearest name before `start` in `text`, else the first after it; None when `text` names none.

    Where a name of what is compared and OTHER match at the same place ("rung 02"
    is both the previous rung and a rung), the former counts.
    """
    hits = {}
    for kind, pat in patterns:
        for m in pat.finditer(text):
            if hits.get(m.start()) in (None, OTHER):
                hits[m.start()] = kind
    before = [p for p in hits if p < start]
    if before:
        return hits[max(before)]
    after = [p for p in hits if p >= start]
    return hits[min(after)] if after else None


def d_values(clause):
    """The head dims a clause's "D = ..." qualifiers name, as a predicate; None without one."""
    found = D_QUALIFIER.findall(clause)
    if not found:
        return None

    def allows(D):
        for op, nums in found:
            values = [int(x) for x in re.findall(r"\d+", nums)]
            if op == "=" and re.search(r"[–-]", nums):
                ok = values[0] <= D <= values[-1]
            elif op == "=":
                ok = D in values
            else:
                ok = {"≤": D <= values[0], "<=": D <= values[0], "≥": D >= values[0], ">=": D >= values[0],
                      "<": D < values[0], ">": D > values[0]}[op]
            if not ok:
                return False
        return True
    return allows


def qualifies(ratio, clause, head_dims):
    """Whether `ratio`'s row is one the clause's qualifiers (and the head dims in force, `head_dims`) allow."""
    if head_dims is not None and not head_dims(ratio.D):
        return False
    for name, value in N_QUALIFIER.findall(clause):
        value = int(value)
        if {"N": ratio.Nq != value or ratio.Nk != value, "Nq": ratio.Nq != value, "Nk": ratio.Nk != value}[name]:
            return False
    lower = clause.lower()
    if "causal or not" not in lower:
        if re.search(r"non-causal|not causal|\bdense\b", lower):
            if ratio.causal:
                return False
        elif "causal" in lower and not ratio.causal:
            return False
    if "short" in lower and not ratio.Nq < ratio.Nk:
        return False
    if "gqa" in lower and ratio.gqa is False:
        return False
    return True


def decimals(text):
    return len(text.split(".")[1])


def shown(value, n):
    """`value` as the table shows it (two decimals), then rounded half up to n decimals, as a reader would."""
    return float(Decimal(f"{value:.2f}").quantize(Decimal(1).scaleb(-n), rounding=ROUND_HALF_UP))


def within(lo, hi, values):
    """Whether the claim lo..hi (strings) lies inside the range of `values`, at the claim's precision."""
    n = max(decimals(lo), decimals(hi))
    return shown(min(values), n) <= float(lo) and float(hi) <= shown(max(values), n)


def check_text(text, page, rows, bwd_rows=None):
    """[Problem] of the page's prose ratios outside its table's; [] for a page without a numbers block."""
    m = doc_tables.MARKER.search(text)
    if m is None:
        return []
    rung, prev = m.group("rung"), m.group("prev")
    backward = ladder.is_backward(rung)
    source = bwd_rows if backward else rows
    if not source:
        return []
    ratios = table_ratios(source, rung, prev, backward)
    if not ratios:
        return []
    patterns = kind_patterns(prev)
    problems = []
    for para in prose(text):
        for sentence in SENTENCE_END.split(para):
            # A name's brackets, as in sdpa(flash), are not an aside: ⟨ ⟩ (same length) keep them apart.
            sentence = NAME_BRACKETS.sub(r"\1⟨\2⟩", sentence)
            if OTHER_SOURCE.search(sentence):
                continue
            spans, head_dims, before = clauses(sentence), None, ""
            found = claims(sentence)
            for a, b in spans:
                clause = sentence[a:b]
                if a and sentence[a] == ";":
                    head_dims, before = None, ""  # a semicolon starts a new statement
                # A clause without "D = ..." keeps the last one's head dims; a clause with no
                # qualifier at all ("(0.93×)") reads those of the clause just before it.
                head_dims = d_values(clause) or head_dims
                context = clause if QUALIFIER_WORDS.search(clause) else before
                before = clause
                for match, lo, hi in (c for c in found if a <= c[0].start() < b):
                    bracket = own_bracket(sentence, match.start())
                    kind = (kind_in(clause, match.start() - a, patterns) or
                            kind_in(sentence[bracket[0]:bracket[1]], match.start() - bracket[0], patterns) or
                            kind_in(outside_brackets(sentence, match.start()), match.start(), patterns))
                    if kind == OTHER:
                        continue
                    # Two readings: with the qualifiers carried over from the clauses before, and
                    # with the clause's own alone ("1.24× and 1.34× causal" pairs up in ways no
                    # rule can tell); the ratio passes when either reading's range holds it.
                    readings = [(head_dims, context), (d_values(clause), clause)]
                    ranges = [[r.value for r in ratios if (kind is None or r.kind == kind) and qualifies(r, c, d)]
                              for d, c in readings]
                    claim = match.group(0).strip()
                    ranges = [v for v in ranges if v]
                    if not ranges:
                        problems.append(Problem(page, sentence.strip(), claim, kind or "any", None, None))
                    elif not any(within(lo, hi, v) or within(lo, hi, [1 / x for x in v]) for v in ranges):
                        problems.append(Problem(page, sentence.strip(), claim, kind or "any",
                                                min(ranges[0]), max(ranges[0])))
    return problems


def describe(p):
    if p.lo is None:
        what = f"the table has no {p.kind} ratio for its qualifiers"
    else:
        what = f"the table's {p.kind} ratios there are {p.lo:.2f}–{p.hi:.2f}"
    text = p.text.replace("⟨", "(").replace("⟩", ")")
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{p.page}: '{p.claim}' in \"{text}\": {what}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="results/H200", help="a GPU's results folder")
    ap.add_argument("pages", nargs="*", help="pages to check (default: docs/*.md)")
    args = ap.parse_args(argv)
    try:
        rows, bwd_rows = rc.load_gpu(args.folder), rc.load_bwd(args.folder)
    except rc.CsvError as e:
        print(f"prose_ratios.py: error: {e}", file=sys.stderr)
        return 2
    pages = args.pages or sorted(os.path.join("docs", n) for n in os.listdir("docs") if n.endswith(".md"))
    problems = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            problems += check_text(f.read(), page, rows, bwd_rows)
    for p in problems:
        print(describe(p))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
