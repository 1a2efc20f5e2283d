#!/usr/bin/env python3
"""The ptxas spill warnings of the build: the expected ones counted, the others shown.

A few kernels spill on purpose (each measured faster than every spill-free
build of it; its docs page says so). results/ptxas_spills.csv lists the
warnings a default build prints (-Xptxas -warn-spills -warn-lmem-usage), one
row each; docs/spills.md shows them as a table (regenerate.py). The build runs
nvcc through this script and ends with one line:

    filter --log-dir DIR --source-dir SRC -- nvcc ARGS...   (CMake's CUDA_COMPILER_LAUNCHER)
        runs nvcc; keeps its ptxas spill and local-memory warnings out of the
        output when the CSV lists them (all of them go to DIR/<object>.txt);
        prints any other, with what the CSV says
    summary --log-dir DIR --source-dir SRC      (after attnlab_kernels is built)
        "attnlab: 48 expected ptxas spill warnings (docs/spills.md lists them)"
    record --log-dir DIR --source-dir SRC       writes results/ptxas_spills.csv from a
        default build's logs (after a kernel's spills changed on purpose)

table_block() is the table of docs/spills.md (scripts/regenerate.py fills it).
"""
import argparse
import csv
import glob
import os
import re
import subprocess
import sys

CSV = os.path.join("results", "ptxas_spills.csv")
PAGE = "docs/spills.md"
COLUMNS = ("source", "symbol", "warning", "bytes", "kernel", "cuda")  # the first four identify a warning
BEGIN, END = "<!-- spills:begin -->", "<!-- spills:end -->"
# The kernel families that spill, by source path: (prefix, name, docs page).
FAMILIES = (("kernels/flash_attn/12_", "rung 12 `ws`", "12_ws_pingpong.md"),
            ("kernels/dmattn/dmattn_fwd", "dynamic-mask forward", "dmattn_forward.md"),
            ("kernels/dmattn/dmattn_bwd", "dynamic-mask backward", "dmattn_backward.md"),
            ("kernels/blocksparse/instances/fwd_", "block-sparse forward", "blocksparse.md"),
            ("kernels/blocksparse/instances/bwd_", "block-sparse backward", "blocksparse.md"),
            ("kernels/varlen/varlen_fwd", "variable-length forward", "varlen.md"))
WARNING = re.compile(r"^ptxas warning : (?:Registers are spilled to local memory in function '(?P<spill>[^']+)', "
                     r"(?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
                     r"|Local memory used for function '(?P<lmem>[^']+)', size of stack frame: (?P<frame>\d+) bytes)$")


def normalize(symbol):
    """The mangled name with each anonymous namespace's per-file id made the plain `12_GLOBAL__N_1`."""
    out, at = [], 0
    for m in re.finditer(r"(\d+)(_GLOBAL__N_)", symbol):
        if m.start() < at:
            continue
        out.append(symbol[at:m.start()] + "12_GLOBAL__N_1")
        at = m.start(2) + int(m.group(1))
    return "".join(out) + symbol[at:]


def parse_warning(line):
    """(symbol, 'spill' | 'stack frame', bytes) of a ptxas spill or local-memory warning, else None."""
    m = WARNING.match(line.strip())
    if not m:
        return None
    if m.group("spill"):
        return normalize(m.group("spill")), "spill", f"{m.group('stores')} stores, {m.group('loads')} loads"
    return normalize(m.group("lmem")), "stack frame", m.group("frame")


def readable(symbols):
    """{symbol: the kernel as c++filt writes it, without attnlab:: and the parameter list} (the symbol without c++filt)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True).stdout.splitlines()
    except OSError:
        out = []
    names = {}
    for symbol, name in zip(symbols, out if len(out) == len(symbols) else symbols):
        depth = 0
        for i in range(len(name) - 1, -1, -1):  # the parameter list: the last balanced (...)
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0 and name[i] == "(":
                name = name[:i]
                break
        names[symbol] = re.sub(r"^void ", "", name).replace("attnlab::", "")
    return names


def load_expected(source_dir):
    """{(source, symbol, warning, bytes)} the CSV lists, and the CUDA release it was recorded with."""
    path = os.path.join(source_dir, CSV)
    if not os.path.isfile(path):
        return set(), "?"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {tuple(r[c] for c in COLUMNS[:4]) for r in rows}, (rows[0]["cuda"] if rows else "?")


def arg_after(args, flag):
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def log_name(log_dir, obj):
    return os.path.join(log_dir, obj.replace(os.sep, "_").replace("/", "_") + ".txt")


def source_of(args, source_dir):
    src = arg_after(args, "-c") or (args[-1] if args else "")
    rel = os.path.relpath(os.path.abspath(src), os.path.abspath(source_dir))
    return rel.replace(os.sep, "/")


def filter_main(opts, command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stdout.write(result.stdout)
    expected, cuda = load_expected(opts.source_dir)
    source = source_of(command, opts.source_dir)
    found, rest = [], []
    for line in result.stderr.splitlines(keepends=True):
        w = parse_warning(line)
        if w is None:
            rest.append(line)
            continue
        found.append((source,) + w)
        if (source,) + w not in expected:
            rest.append(line.rstrip("\n") + f"\n  (a new spill: not in {CSV}, recorded with CUDA {cuda})\n")
    sys.stderr.write("".join(rest))
    obj = arg_after(command, "-o")
    if obj and result.returncode == 0:
        os.makedirs(opts.log_dir, exist_ok=True)
        with open(log_name(opts.log_dir, obj), "w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerows(found)
    return result.returncode


def logged(log_dir):
    """Every (source, symbol, warning, bytes) the build's logs hold, in a stable order."""
    rows = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*.txt"))):
        with open(path, newline="", encoding="utf-8") as f:
            rows += [tuple(r) for r in csv.reader(f) if len(r) == 4]
    return rows


def summary_main(opts):
    expected, _ = load_expected(opts.source_dir)
    rows = logged(opts.log_dir)
    listed = sum(1 for r in rows if r in expected)
    line = f"attnlab: {listed} expected ptxas spill warnings ({PAGE} lists them)"
    if len(rows) > listed:
        line += f"; {len(rows) - listed} new ones, printed above"
    print(line)
    return 0


def cuda_release():
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "?"


def record_main(opts):
    rows = sorted(set(logged(opts.log_dir)))
    cuda = cuda_release()
    names = readable(sorted({r[1] for r in rows}))
    with open(os.path.join(opts.source_dir, CSV), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        w.writerows(r + (names[r[1]], cuda) for r in rows)
    print(f"wrote {CSV}: {len(rows)} warnings (CUDA {cuda})")
    return 0


def load(path):
    """The rows of results/ptxas_spills.csv; ValueError when it cannot be read or is not that file."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields, rows = tuple(reader.fieldnames or ()), list(reader)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    if fields != COLUMNS:
        raise ValueError(f"{path}: expected the columns {','.join(COLUMNS)}")
    for i, r in enumerate(rows, 2):
        if r["warning"] not in ("spill", "stack frame") or any(not r[c] for c in COLUMNS):
            raise ValueError(f"{path}:{i}: expected a spill or stack frame warning with every field")
    return rows


def table_block(rows, docs_link):
    """The generated block of docs/spills.md: one row per kernel, its spill and its stack frame.

    docs_link: the docs folder relative to the page ('' from docs/ itself).
    """
    kernels = {}
    for r in rows:
        k = kernels.setdefault((r["source"], r["symbol"]), {"kernel": r["kernel"], "spill": "–", "stack frame": "–"})
        k[r["warning"]] = r["bytes"].replace(" stores, ", " / ").replace(" loads", "")
    def family(source):
        for prefix, name, page in FAMILIES:
            if source.startswith(prefix):
                return f"[{name}]({docs_link}{page})"
        return "–"
    cudas = sorted({r["cuda"] for r in rows}) or ["–"]
    lines = ["<!-- generated by scripts/regenerate.py from results/ptxas_spills.csv (scripts/ptxas_spills.py record "
             "writes it); edit the CSV, not this block -->",
             f"{len(rows)} warnings of a default build (sm_80 and sm_90a, CUDA {', '.join(cudas)}), two per kernel: "
             "the bytes it spills (stores / loads) and the stack frame they live in.", "",
             "| family | source | kernel | spill stores / loads (bytes) | stack frame (bytes) |",
             "|---|---|---|---:|---:|"]
    for (source, _), k in sorted(kernels.items(), key=lambda kv: (family(kv[0][0]), kv[0][0], kv[1]["kernel"])):
        lines.append(f"| {family(source)} | `{source.rsplit('/', 1)[-1]}` | `{k['kernel']}` | {k['spill']} | "
                     f"{k['stack frame']} |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("filter", "summary", "record"))
    p.add_argument("--log-dir", required=True)
    p.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    opts = p.parse_args(argv)
    if opts.mode == "filter":
        if not command:
            p.error("filter needs the compiler command after --")
        return filter_main(opts, command)
    return summary_main(opts) if opts.mode == "summary" else record_main(opts)


if __name__ == "__main__":
    sys.exit(main())
