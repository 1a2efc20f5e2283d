"""Read a GPU's results and pick the rows the plots and tables show.

The one results source of every generated table and plot (plot.py,
doc_tables.py, compare_gpus.py, ladder.py, regenerate.py); standard library
only. A results CSV has the header in COLUMNS (docs/results.md says what each
column means). A GPU's folder results/<gpu>/ holds its forward CSVs, FORWARD_CSVS
in this order: the sweep's fwd.csv and gpu_check's bench.csv. load_gpu() reads
them all and merges their rows with one rule: for the same KEY (variant and
shape) the row with the newest `date` wins; on equal dates, the later one (the
later file in FORWARD_CSVS, the later line in a file). The dense backward's
rows (flash_attn_mma --bwd: BACKWARD_CSV, bwd.csv) are kept apart: load_bwd()
merges them by the same rule, and no forward table or plot sees them. Rows
merged from several runs are named in captions by run: a run is one commit's
rows of one day (run_key), lettered a, b, ... in the order the runs started
(run_names), the same letters in every table and plot of a GPU.
"""
import csv
import os
import re
from collections import Counter
from dataclasses import dataclass

COLUMNS = ("gpu", "driver", "cuda", "commit", "date", "variant", "kind", "B", "H", "Nq", "Nk", "D", "Dv",
           "dtype", "causal", "time_ms", "tflops", "ratio_to_best_peer", "status", "max_err", "tol", "lse_err",
           "seed", "note")
# Hkv is not a CSV column: a GQA row's note starts "Hkv=N; " (the harness writes
# it), and _parse() gives every row an "Hkv" field, H when the note has none.
KEY = ("variant", "B", "H", "Hkv", "Nq", "Nk", "D", "Dv", "dtype", "causal")
INT_COLUMNS = ("B", "H", "Nq", "Nk", "D", "Dv", "causal")
FLOAT_COLUMNS = ("time_ms", "tflops")
PEER, RUNG = "peer", "rung"
TABLE_N = 8192  # the N the tables show when the CSV has it
FORWARD_CSVS = ("fwd.csv", "bench.csv")  # a GPU folder's forward results, in merge order
BACKWARD_CSV = "bwd.csv"  # a GPU folder's dense backward results (gpu_check.sh bwd)


# results/gone_commits.csv (columns commit, note): the commits that rows or docs/experiments.md name but the
# history lacks (amended or rebased away after the run), each with a note that says so, what it measured and the
# commit that did reach the history. Every caption prints the note after the commit (commit_label);
# load_gone_commits() reads the file, regenerate.py --check fails on any other commit the history lacks.
GONE_CSV = "gone_commits.csv"
GONE = {}


class CsvError(Exception):
    """A results CSV that cannot be read: missing file, missing column, bad value."""


def forward_csvs(folder):
    """The forward results CSVs of a GPU folder that exist, in FORWARD_CSVS order."""
    paths = (os.path.join(folder, name) for name in FORWARD_CSVS)
    return [p for p in paths if os.path.isfile(p)]


def load_gpu(folder):
    """The merged forward rows of one GPU folder (results/<gpu>/); [] when it has no forward CSV."""
    return load(forward_csvs(folder))


def load_bwd(folder):
    """The merged backward rows of one GPU folder, from its bwd.csv; None when it has none."""
    path = os.path.join(folder, BACKWARD_CSV)
    return load([path]) if os.path.isfile(path) else None


def gpu_folders(results_dir):
    """Sorted sub-folders of `results_dir` that hold a forward results CSV."""
    if not os.path.isdir(results_dir):
        return []
    folders = (os.path.join(results_dir, name) for name in sorted(os.listdir(results_dir)))
    return [f for f in folders if os.path.isdir(f) and forward_csvs(f)]


def load(paths):
    """The rows of the CSVs in `paths`, merged: for each KEY the newest `date` wins, ties the later row.

    Rows keep the order in which their KEY first appeared.
    """
    latest = {}
    for path in paths:
        for row in _read(path):
            key = tuple(row[k] for k in KEY)
            if key not in latest or row["date"] >= latest[key]["date"]:
                latest[key] = row
    return list(latest.values())


def _read(path):
    try:
        f = open(path, newline="", encoding="utf-8")
    except OSError as e:
        raise CsvError(f"cannot read {path}: {e.strerror}") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise CsvError(f"{path}: not a results CSV, missing column(s): {' '.join(missing)}")
        for row in reader:
            yield _parse(row, f"{path}:{reader.line_num}")


def _parse(row, where):
    if any(row[c] is None for c in COLUMNS):
        raise CsvError(f"{where}: expected {len(COLUMNS)} fields")
    for columns, convert in ((INT_COLUMNS, int), (FLOAT_COLUMNS, _optional_float)):
        for c in columns:
            try:
                row[c] = convert(row[c])
            except ValueError:
                raise CsvError(f"{where}: {c} is not a number: '{row[c]}'") from None
    m = re.match(r"Hkv=(\d+);", row["note"])
    row["Hkv"] = int(m.group(1)) if m else row["H"]
    return row


def note_text(note):
    """An unsupported row's note as a sentence for a table: the commas the CSV stores as ';' inside
    {...} restored, the kernels' gloss '(D, or D/Dv)' dropped (the set writes D/Dv where they differ),
    and 'head dims 128' of one head dim made 'head dim 128'."""
    text = re.sub(r"\{[^}]*\}", lambda m: m.group(0).replace("; ", ", "), note)
    text = re.sub(r" \(D[,;] or D/Dv\)", "", text)
    return re.sub(r"\bhead dims (\d+) ", r"head dim \1 ", text)


def heads_label(row):
    """H, or H/Hkv for a GQA row: '32/8'."""
    return str(row["H"]) if row["Hkv"] == row["H"] else f"{row['H']}/{row['Hkv']}"


def dims_label(row):
    """D, or D/Dv when they differ: '192/128'."""
    return str(row["D"]) if row["Dv"] == row["D"] else f"{row['D']}/{row['Dv']}"


def _optional_float(text):
    return float(text) if text.strip() else None


def run_of(row):
    """The run a row comes from: one harness process has one commit and one start date."""
    return row["gpu"], row["commit"], row["date"]


def ran(row):
    """True when the row has a time and its check did not fail."""
    return row["tflops"] is not None and row["status"] not in ("FAIL", "error")


def most_common(values):
    """The most frequent value; ties go to the smallest, so the choice is deterministic."""
    counts = Counter(values)
    return max(sorted(counts), key=counts.__getitem__)


def preferred_n(ns):
    """TABLE_N when present, else the largest N."""
    return TABLE_N if TABLE_N in ns else max(ns)


def short_date(date):
    """'2025-06-02T10:15:00Z' -> '2025-06-02'."""
    return date[:10]


def posix_relpath(path, start):
    """`path` relative to the directory `start`, with forward slashes (for markdown links)."""
    return os.path.relpath(path, start).replace(os.sep, "/")


@dataclass
class Slice:
    """The forward rows one plot set shows: Nq = Nk, D = Dv, one (B, H) and one dtype."""
    B: int
    H: int
    dtype: str
    rows: list

    def values(self, column):
        return sorted({r[column] for r in self.rows})

    def at(self, **fixed):
        return [r for r in self.rows if all(r[k] == v for k, v in fixed.items())]

    def describe(self):
        return f"B={self.B}, H={self.H}, {self.dtype}"


def forward_slice(rows):
    """Square shapes (Nq = Nk, D = Dv) with the most common (B, H); fp16 when present.

    Returns None when no row qualifies.
    """
    square = [r for r in rows if r["Nq"] == r["Nk"] and r["D"] == r["Dv"]]
    if not square:
        return None
    B, H = most_common((r["B"], r["H"]) for r in square)
    same_bh = [r for r in square if (r["B"], r["H"]) == (B, H)]
    dtypes = {r["dtype"] for r in same_bh}
    dtype = "fp16" if "fp16" in dtypes else most_common(r["dtype"] for r in same_bh)
    return Slice(B, H, dtype, [r for r in same_bh if r["dtype"] == dtype])


def variants(rows, kind):
    """Sorted names of the variants of `kind` that appear in `rows` (ran or not)."""
    return sorted({r["variant"] for r in rows if r["kind"] == kind})


def tflops(rows, variant):
    """TFLOPS of `variant` in `rows` (one shape) when it ran, else None."""
    return next((r["tflops"] for r in rows if r["variant"] == variant and ran(r)), None)


def best(rows, kind):
    """The fastest row of `kind` that ran, or None."""
    candidates = [r for r in rows if r["kind"] == kind and ran(r)]
    return max(candidates, key=lambda r: (r["tflops"], r["variant"]), default=None)


def best_ratio(rows):
    """Best rung TFLOPS / best peer TFLOPS over `rows` (one shape), or None when either is missing."""
    rung, peer = best(rows, RUNG), best(rows, PEER)
    if rung is None or peer is None:
        return None
    return rung["tflops"] / peer["tflops"]


def load_gone_commits(results_dir):
    """Reads results_dir/gone_commits.csv into GONE ({commit: note}; empty without the file) and returns it."""
    GONE.clear()
    path = os.path.join(results_dir, GONE_CSV)
    if not os.path.isfile(path):
        return GONE
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != ["commit", "note"]:
            raise CsvError(f"{path}: expected the columns commit,note")
        for row in reader:
            if not re.fullmatch(r"[0-9a-f]{7,40}", row["commit"] or "") or not (row["note"] or "").strip():
                raise CsvError(f"{path}:{reader.line_num}: expected a commit hash and a note")
            GONE[row["commit"]] = row["note"].strip()
    return GONE


def commit_label(commit):
    """A commit as a caption shows it: with its note when the history lacks it (GONE)."""
    return f"{commit} ({GONE[commit]})" if commit in GONE else commit


def run_key(row):
    """The run a caption names a row by: (commit, day). One gpu_check step starts a harness process
    per shape, each with its own start time; its rows share the commit and the day."""
    return row["commit"], short_date(row["date"])


def run_names(rows):
    """{run_key: letter} of the runs in `rows`, lettered a, b, c, ... in the order of their first start."""
    first = {}
    for r in rows:
        key = run_key(r)
        first[key] = min(first.get(key, r["date"]), r["date"])
    ordered = sorted(first, key=lambda k: (first[k], k))
    return {key: _letter(i) for i, key in enumerate(ordered)}


def _letter(i):
    return chr(ord("a") + i) if i < 26 else f"r{i + 1}"


def describe_run(key):
    """'commit 29305e193406, 2026-12-02' (a commit the history lacks with its note)."""
    commit, day = key
    return f"commit {commit_label(commit)}, {day}"


def runs_legend(names):
    """'a = commit 0ec0b4e, 2026-11-29; b = ...' for every run of `names` (run_names), in letter order."""
    return "; ".join(f"{letter} = {describe_run(key)}" for key, letter in names.items())


def runs_label(rows, names, joiner=", "):
    """The letters (run_names) of the runs `rows` come from, sorted and joined: 'a, b'; '–' without rows."""
    letters = sorted({names[run_key(r)] for r in rows}, key=lambda s: (len(s), s))
    return joiner.join(letters) or "–"


def provenance(rows):
    """(GPU names, commits, 'first – last' date) of `rows`, each sorted and joined for display."""
    gpus = ", ".join(sorted({r["gpu"] for r in rows})) or "–"
    commits = ", ".join(commit_label(c) for c in sorted({r["commit"] for r in rows})) or "–"
    dates = sorted({short_date(r["date"]) for r in rows})
    span = " – ".join(sorted({dates[0], dates[-1]})) if dates else "–"
    return gpus, commits, span


def fmt_tflops(value):
    return "–" if value is None else f"{value:.1f}"


def fmt_ratio(value):
    return "–" if value is None else f"{value:.2f}"
