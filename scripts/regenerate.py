#!/usr/bin/env python3
"""Regenerate every generated table and plot from the results CSVs.

    python3 scripts/regenerate.py [--root DIR] [--gpu NAME] [--check]

From the CSVs under DIR/results/ (DIR: the repository, by default), rewrites
  - results/<gpu>/fwd_*.png of every GPU folder (plot.py), from its merged
    forward rows (results_csv.load_gpu: fwd.csv and bench.csv, the newest row
    of each variant and shape);
  - results/<gpu>/dmattn/dmattn_*.png and summary.md (plot_dmattn.py);
  - results/<gpu>/blocksparse.png of every GPU folder with a blocksparse.csv
    (blocksparse_table.py);
  - results/compare_gpus.md and .png (compare_gpus.py);
  - docs/figures/*.png, the layout figures drawn from the kernels' sources
    (figures.py), when DIR has them (kernels/);
  - in README.md and docs/*.md, every generated block, found by its markers
    (each a line of its own), from the GPU folder --gpu (default H200):
      <!-- results:begin --> ... <!-- results:end -->   the results table (plot.py)
      <!-- ladder:begin --> ... <!-- ladder:end -->     one row per forward rung at one shape (ladder.py),
                                                        and the main path's bars (fwd_main_path.png)
      <!-- ladder-bwd:begin --> ... <!-- ladder-bwd:end -->   the same of the backward rungs, from bwd.csv
      <!-- numbers: RUNG prev=RUNG --> ... <!-- numbers:end -->   a rung's table (doc_tables.py;
                                                                  a backward rung's from bwd.csv)
      <!-- dmattn-table: TABLE --> ... <!-- dmattn-table:end -->   a dynamic-mask table (plot_dmattn.py)
      <!-- blocksparse:begin --> ... <!-- blocksparse:end -->   the block-sparse table, from blocksparse.csv
                                                                  (blocksparse_table.py)
      <!-- spills:begin --> ... <!-- spills:end -->   the kernels that spill, from results/ptxas_spills.csv
                                                      (ptxas_spills.py)
      <!-- output:begin --> ... <!-- output:end -->   the harness's output, cut from results/<gpu>/bench.txt
                                                      (output_excerpt.py)
      <!-- wgmma-desc:begin --> ... <!-- wgmma-desc:end -->   rung 07's decoded wgmma descriptors, from the
                                                              kernels' sources (wgmma_desc.py)
A commit the history lacks is named in a caption with its note from
results/gone_commits.csv (what it measured, the commit that did reach the
history). With history (DIR the top of a git work tree, not shallow), every
commit the results CSVs, docs/experiments.md's commit column and those notes
name must be one `git cat-file -e` finds, or be listed there: --check fails
(exit 1) on any other, naming it and its file; without --check it is a warning.
Every page's prose is checked too: a ratio written in a rung page's text
(e.g. "1.16× at D = 64") must lie within the range of the ratios its generated
table gives for what the sentence compares (prose_ratios.py).
The output depends only on the CSVs (and, for PNGs, the matplotlib version,
which each PNG records): rerunning changes nothing. A file is written only when
its bytes change. With --check nothing is written; the files that would change
and the prose ratios outside their tables are listed, and the exit code is 1 if
a file would change, a commit is unknown or a prose ratio fails (without
--check a prose ratio only warns). Exits 2, with one line on stderr, on an
unreadable CSV or malformed markers.
"""
import argparse
import csv
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blocksparse_table  # noqa: E402
import compare_gpus  # noqa: E402
import doc_tables  # noqa: E402
import figures  # noqa: E402
import generated  # noqa: E402
import ladder  # noqa: E402
import plot  # noqa: E402
import output_excerpt  # noqa: E402
import plot_dmattn  # noqa: E402
import ptxas_spills  # noqa: E402
import prose_ratios  # noqa: E402
import wgmma_desc  # noqa: E402
import results_csv as rc  # noqa: E402

DOCS_GPU = "H200"  # the GPU whose results the README and the docs pages show
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=REPO, help="the tree to regenerate (default: this repository)")
    p.add_argument("--gpu", default=DOCS_GPU, help=f"results/<gpu>/ the README and docs show (default: {DOCS_GPU})")
    p.add_argument("--check", action="store_true", help="write nothing; list what would change, exit 1 if anything")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        files = outputs(args.root, args.gpu)
        unknown = unknown_commits(args.root)
    except (rc.CsvError, generated.BlockError, ValueError) as e:
        print(f"regenerate.py: error: {e}", file=sys.stderr)
        return 2
    changed = [rel for rel, data in sorted(files.items()) if read_bytes(os.path.join(args.root, rel)) != data]
    for rel, commit in unknown or ():
        print(f"{'' if args.check else 'warning: '}{rel} names commit {commit}, which is not in the history: "
              f"correct it, or list it in results/{rc.GONE_CSV} with what it measured", file=sys.stderr)
    problems = prose_problems(args.root, args.gpu, files)
    for p in problems:
        print(f"prose ratio outside its table: {prose_ratios.describe(p)}",
              file=sys.stdout if args.check else sys.stderr)
    if args.check:
        for rel in changed:
            print(f"would change: {rel}")
        print("commits not checked (no git history here)" if unknown is None else
              f"{len(unknown)} named commits not in the history")
        print(f"{len(files) - len(changed)} of {len(files)} generated files up to date; "
              f"{len(problems)} prose ratio{'s' if len(problems) != 1 else ''} outside their tables")
        return 1 if changed or unknown or problems else 0
    for rel in changed:
        path = os.path.join(args.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        generated.write_if_changed(path, files[rel])
        print(f"wrote {rel}")
    print(f"{len(files) - len(changed)} of {len(files)} generated files were up to date")
    return 0


def prose_problems(root, gpu, files):
    """[prose_ratios.Problem] of every docs page, as regenerated (`files`), against results/<gpu>/."""
    folder = os.path.join(root, "results", gpu)
    if not os.path.isdir(folder):
        return []
    rows, bwd_rows = rc.load_gpu(folder), rc.load_bwd(folder)
    problems = []
    for page in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        rel = rc.posix_relpath(page, root)
        text = files.get(rel) or read_bytes(page)
        problems += prose_ratios.check_text(text.decode("utf-8"), rel, rows, bwd_rows)
    return problems


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def posix(*parts):
    return "/".join(parts)


def named_commits(root):
    """[(path relative to root, commit)] of every commit the results name, each once per file.

    The `commit` column of every CSV under results/ (a "-dirty" suffix dropped: its
    tree is that commit's, modified), the commit column of docs/experiments.md's
    tables (its last cell) and the commits the notes of results/gone_commits.csv cite.
    """
    named = []
    for path in sorted(glob.glob(os.path.join(root, "results", "**", "*.csv"), recursive=True)):
        rel = rc.posix_relpath(path, root)
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if rel == f"results/{rc.GONE_CSV}":  # the commits its notes cite
                commits = {c for row in reader for c in HEX.findall(row["note"] or "")}
            elif "commit" in (reader.fieldnames or ()):
                commits = {row["commit"].removesuffix("-dirty") for row in reader if row["commit"]}
            else:
                commits = set()
        named += [(rel, c) for c in sorted(commits)]
    experiments = os.path.join(root, "docs", "experiments.md")
    if os.path.isfile(experiments):
        with open(experiments, encoding="utf-8") as f:
            cells = [line.rstrip().rstrip("|").rsplit("|", 1)[-1] for line in f if line.startswith("|")]
        commits = dict.fromkeys(c for cell in cells for c in HEX.findall(cell))
        named += [("docs/experiments.md", c) for c in commits]
    return named


HEX = re.compile(r"\b[0-9a-f]{7,40}\b")


def unknown_commits(root):
    """[(path, commit)] of the named commits the history lacks and gone_commits.csv does not list.

    None, nothing checked, unless `root` is the top of a git work tree with its whole history.
    """
    def git(*args, stdin=None):
        try:
            return subprocess.run(["git", "-C", root, *args], input=stdin, capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
    top = git("rev-parse", "--show-toplevel", "--is-shallow-repository")
    if top is None or top.returncode != 0:
        return None
    lines = top.stdout.splitlines()
    if len(lines) != 2 or os.path.realpath(lines[0]) != os.path.realpath(root) or lines[1] != "false":
        return None
    gone = rc.load_gone_commits(os.path.join(root, "results"))
    named = [(rel, c) for rel, c in named_commits(root) if c not in gone]
    wanted = sorted({c for _, c in named})
    found = git("cat-file", "--batch-check=%(objecttype)", stdin="".join(f"{c}^{{commit}}\n" for c in wanted))
    if found is None or found.returncode != 0:
        return None
    kinds = dict(zip(wanted, found.stdout.splitlines()))
    return [(rel, c) for rel, c in named if kinds.get(c) != "commit"]


def outputs(root, docs_gpu):
    """{path relative to root, '/'-separated: bytes} of every generated file."""
    results = os.path.join(root, "results")
    rc.load_gone_commits(results)
    files = {}
    gpu_rows = {}
    for folder in rc.gpu_folders(results):
        name = os.path.basename(folder)
        gpu_rows[name] = rc.load_gpu(folder)
        for png, data in plot.render(gpu_rows[name]).items():
            files[posix("results", name, png)] = data
    for csv_path in sorted(glob.glob(os.path.join(results, "*", blocksparse_table.CSV))):
        folder = os.path.dirname(csv_path)
        png = blocksparse_table.plot(blocksparse_table.load(folder))
        if png is not None:
            files[posix("results", os.path.basename(folder), blocksparse_table.PNG)] = png
    for folder in sorted(glob.glob(os.path.join(results, "*", "dmattn"))):
        if plot_dmattn.found(folder):
            name = os.path.basename(os.path.dirname(folder))
            for out, data in plot_dmattn.render(folder).items():
                files[posix("results", name, "dmattn", out)] = data
    gpus = compare_gpus.load_gpus(results)
    if gpus:
        for out, data in compare_gpus.render(gpus, results).items():
            files[posix("results", out)] = data
    if figures.found(root):
        for name, data in figures.render(root).items():
            files[posix(*figures.FOLDER, name)] = data
    pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    for page in pages:
        text = read_bytes(page)
        if text is None:
            continue
        text = text.decode("utf-8")
        new = fill_page(text, page, root, docs_gpu, gpu_rows, files)
        if new is not None:
            files[rc.posix_relpath(page, root)] = new.encode("utf-8")
    return files


def fill_page(text, page, root, gpu, gpu_rows, files):
    """`text` of `page` with every generated block regenerated from results/<gpu>/; None without blocks."""
    where = rc.posix_relpath(page, root)
    page_dir = os.path.dirname(page)
    folder = os.path.join(root, "results", gpu)
    has = {kind: generated.replace_block(text, begin, end, "", where) is not None
           for kind, begin, end in (("results", plot.BEGIN, plot.END), ("ladder", ladder.BEGIN, ladder.END),
                                    ("ladder-bwd", ladder.BWD_BEGIN, ladder.BWD_END))}
    has_numbers, has_dmattn = bool(doc_tables.MARKER.search(text)), bool(plot_dmattn.MARKER.search(text))
    has_blocksparse = generated.replace_block(text, blocksparse_table.BEGIN, blocksparse_table.END, "", where) is not None
    has_spills = generated.replace_block(text, ptxas_spills.BEGIN, ptxas_spills.END, "", where) is not None
    if has_spills:  # not a GPU's results: the build's
        link = rc.posix_relpath(os.path.join(root, "docs"), page_dir)
        rows = ptxas_spills.load(os.path.join(root, ptxas_spills.CSV))
        block = ptxas_spills.table_block(rows, "" if link == "." else link + "/")
        text = generated.replace_block(text, ptxas_spills.BEGIN, ptxas_spills.END, block, where)
    has_output = generated.replace_block(text, output_excerpt.BEGIN, output_excerpt.END, "", where) is not None
    if has_output:
        bench_txt = os.path.join(root, "results", gpu, output_excerpt.SOURCE)
        try:
            with open(bench_txt, encoding="utf-8") as f:
                run = f.read()
        except OSError as e:
            raise ValueError(f"{where} has an output block but cannot read {bench_txt}: {e.strerror}") from None
        block = output_excerpt.excerpt(run, posix("results", gpu, output_excerpt.SOURCE))
        text = generated.replace_block(text, output_excerpt.BEGIN, output_excerpt.END, block, where)
    has_desc = generated.replace_block(text, wgmma_desc.BEGIN, wgmma_desc.END, "", where) is not None
    if has_desc:  # not a GPU's results: the code's
        text = generated.replace_block(text, wgmma_desc.BEGIN, wgmma_desc.END, wgmma_desc.render(root), where)
    if not (any(has.values()) or has_numbers or has_dmattn or has_blocksparse):
        return text if has_spills or has_output or has_desc else None
    if (any(has.values()) or has_numbers) and gpu not in gpu_rows:
        raise ValueError(f"{where} has generated blocks but results/{gpu}/ has no forward results")
    if has["results"]:
        images = {name: os.path.join(root, *rel.split("/")) for name in plot.RESULTS_PLOTS
                  for rel in [posix("results", gpu, name)] if rel in files}
        block = plot.results_block(gpu_rows[gpu], rc.forward_csvs(folder), images, page_dir)
        text = generated.replace_block(text, plot.BEGIN, plot.END, block, where)
    bwd_rows = rc.load_bwd(folder) if has["ladder-bwd"] or has_numbers else None
    if has["ladder"] or has["ladder-bwd"]:
        docs = os.path.join(root, "docs")
        link = rc.posix_relpath(docs, page_dir)
        pages = set(os.listdir(docs)) if os.path.isdir(docs) else set()
        docs_dir = "" if link == "." else link + "/"
        bars = posix("results", gpu, plot.MAIN_PATH_BARS)
        image = rc.posix_relpath(os.path.join(root, *bars.split("/")), page_dir) if bars in files else None
        for kind, begin, end, rows in (("ladder", ladder.BEGIN, ladder.END, gpu_rows[gpu]),
                                       ("ladder-bwd", ladder.BWD_BEGIN, ladder.BWD_END, bwd_rows)):
            if has[kind]:
                block = ladder.ladder_block(rows, posix("results", gpu), docs_dir, pages, backward=kind == "ladder-bwd",
                                            image=None if kind == "ladder-bwd" else image,
                                            profiles=ladder.load_profiles(folder))
                text = generated.replace_block(text, begin, end, block, where)
    if has_numbers:
        text = doc_tables.fill(text, gpu_rows[gpu], bwd_rows)
    if has_dmattn:
        text = plot_dmattn.fill(text, os.path.join(folder, "dmattn"), where)
    if has_blocksparse:
        link = rc.posix_relpath(os.path.join(folder, blocksparse_table.CSV), page_dir)
        block = blocksparse_table.block(blocksparse_table.load(folder), link)
        text = generated.replace_block(text, blocksparse_table.BEGIN, blocksparse_table.END, block, where)
    return text


if __name__ == "__main__":
    sys.exit(main())
