"""CPU tests of the result scripts: plot.py, compare_gpus.py, doc_tables.py and
plot_dmattn.py on the fixture CSVs; gemm_ceiling.py without a GPU.

    python3 tests/python_cpu/test_plots.py

Needs only Python and matplotlib (no GPU, no pytest). Runs the scripts as a user
would, in a temporary folder, and prints 'N passed, M failed'; exits 1 on any
failure.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "scripts", "plot.py")
COMPARE = os.path.join(ROOT, "scripts", "compare_gpus.py")
DOC_TABLES = os.path.join(ROOT, "scripts", "doc_tables.py")
PLOT_DMATTN = os.path.join(ROOT, "scripts", "plot_dmattn.py")
GEMM_CEILING = os.path.join(ROOT, "scripts", "gemm_ceiling.py")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "results")
CSV_A = os.path.join(FIXTURES, "FakeGPU-A", "fwd.csv")
PNGS = ("fwd_tflops_vs_N.png", "fwd_tflops_vs_D.png", "fwd_ratio_heatmap.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README = f"# Title\n\nIntro.\n\n{BEGIN}\nstale text\n{END}\n\nAfter the block.\n"

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=300)


def expect_ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def plot_with_readme(tmp):
    """Runs plot.py on FakeGPU-A into tmp/img with tmp/README.md; returns (result, readme path)."""
    readme = os.path.join(tmp, "README.md")
    write(readme, README)
    return run(PLOT, CSV_A, "--out", os.path.join(tmp, "img"), "--readme", readme), readme


@test
def plot_writes_three_pngs(tmp):
    result, _ = plot_with_readme(tmp)
    expect_ok(result)
    for name in PNGS:
        path = os.path.join(tmp, "img", name)
        assert os.path.isfile(path), f"{name} not written"
        assert os.path.getsize(path) > 5 * 1024, f"{name} is only {os.path.getsize(path)} bytes"
        with open(path, "rb") as f:
            assert f.read(8) == PNG_SIGNATURE, f"{name} is not a PNG"
        assert path in result.stdout, f"plot.py did not report writing {name}"


@test
def plot_replaces_readme_block(tmp):
    result, readme = plot_with_readme(tmp)
    expect_ok(result)
    text = read(readme)
    assert "stale text" not in text, "old block kept"
    assert text.startswith("# Title\n\nIntro.\n\n") and text.endswith("\n\nAfter the block.\n"), "text outside changed"
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "markers not kept exactly once"
    block = text[text.index(BEGIN):text.index(END)]
    assert "| D | causal | best rung | TFLOPS |" in block, "table header missing"
    assert "\n| 64 | no | `split-q+stage2` | 263.1 |" in block, "no (or wrong) row for D=64"
    assert "NVIDIA Fake GPU A" in block and "9fa9e89c1d2e" in block, "GPU or commit missing"
    for name in PNGS:
        assert f"(img/{name})" in block, f"no relative link to {name}"


@test
def plot_keeps_last_measurement_and_marks_unsupported(tmp):
    result, readme = plot_with_readme(tmp)
    expect_ok(result)
    rows = [line for line in read(readme).splitlines() if line.startswith("| 512 | no |")]
    assert len(rows) == 1, f"expected one D=512 non-causal row, got {rows}"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == "–" and cells[-1] == "–", f"D=512 has no rung, got {cells}"
    # Peers are sorted: sdpa(cudnn), sdpa(efficient), sdpa(flash), torch(unfused), unfused.
    assert cells[4] == "–" and cells[6] == "–", f"cudnn and flash are unsupported at D=512, got {cells}"


@test
def plot_rerun_gives_identical_readme(tmp):
    result, readme = plot_with_readme(tmp)
    expect_ok(result)
    first = read(readme)
    expect_ok(run(PLOT, CSV_A, "--out", os.path.join(tmp, "img"), "--readme", readme))
    assert read(readme) == first, "second run changed the README"


@test
def plot_without_markers_exits_2(tmp):
    readme = os.path.join(tmp, "README.md")
    write(readme, "# No markers here\n")
    result = run(PLOT, CSV_A, "--out", os.path.join(tmp, "img"), "--readme", readme)
    assert result.returncode == 2, f"exit {result.returncode}, wanted 2\n{result.stderr}"
    assert len(result.stderr.strip().splitlines()) == 1 and "markers" in result.stderr, result.stderr
    assert read(readme) == "# No markers here\n", "README without markers was modified"


@test
def plot_header_only_csv_skips_plots(tmp):
    empty = os.path.join(tmp, "fwd.csv")
    with open(CSV_A, encoding="utf-8") as f:
        write(empty, f.readline())
    result = run(PLOT, empty)
    expect_ok(result)
    assert "skipped" in result.stdout and not any(n in os.listdir(tmp) for n in PNGS), result.stdout


@test
def compare_gpus_writes_md_and_png(tmp):
    result = run(COMPARE, "--results", FIXTURES, "--out", tmp)
    expect_ok(result)
    md = os.path.join(tmp, "compare_gpus.md")
    png = os.path.join(tmp, "compare_gpus.png")
    assert os.path.isfile(md) and os.path.isfile(png), f"outputs missing\n{result.stdout}"
    with open(png, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE, "compare_gpus.png is not a PNG"
    text = read(md)
    assert "FakeGPU-A" in text and "FakeGPU-B" in text, "md does not name both GPUs"
    assert "| 8192 | 64 | no |" in text, "no N=8192, D=64 row"


@test
def compare_gpus_works_with_one_gpu(tmp):
    results = os.path.join(tmp, "results")
    shutil.copytree(os.path.join(FIXTURES, "FakeGPU-B"), os.path.join(results, "FakeGPU-B"))
    os.makedirs(os.path.join(results, "empty-folder"))
    result = run(COMPARE, "--results", results, "--out", results)
    expect_ok(result)
    assert "empty-folder" in result.stdout, "folder without fwd.csv not reported"
    assert "FakeGPU-B" in read(os.path.join(results, "compare_gpus.md"))


@test
def doc_tables_fills_a_rung_page(tmp):
    page = os.path.join(tmp, "02_split_q.md")
    other = os.path.join(tmp, "other.md")
    write(page, "# Rung\n\n<!-- numbers: split-q prev=split-kv -->\nstale\n<!-- numbers:end -->\n\nAfter.\n")
    write(other, "no markers here\n")
    expect_ok(run(DOC_TABLES, CSV_A, page, other))
    text = read(page)
    assert "stale" not in text and "After." in text, text
    assert "| stage1 | stage2 |" in text, "no stage columns"
    assert "| 1,8,8192,8192,64 | fp16 | no |" in text, "no D=64 dense row"
    assert "sdpa(cudnn)" in text and "best stage / sdpa(flash)" in text, text
    assert read(other) == "no markers here\n", "a page without markers was changed"
    expect_ok(run(DOC_TABLES, CSV_A, page))
    assert read(page) == text, "rerun changed the page"


@test
def doc_tables_says_when_a_rung_has_no_rows(tmp):
    # A rung newer than the CSV (rung 12 before its first gpu_check): one
    # sentence, not an empty table with "TFLOPS on –".
    page = os.path.join(tmp, "12_ws_pingpong.md")
    write(page, "<!-- numbers: no-such-rung prev=split-q -->\nstale\n<!-- numbers:end -->\n")
    expect_ok(run(DOC_TABLES, CSV_A, page))
    text = read(page)
    assert "The results CSV has no timed row of this rung." in text and "|" not in text, text


@test
def plot_dmattn_writes_pngs_and_summary(tmp):
    folder = os.path.join(tmp, "dmattn")
    shutil.copytree(os.path.join(FIXTURES, "FakeGPU-A", "dmattn"), folder)
    expect_ok(run(PLOT_DMATTN, folder))
    for png in ("dmattn_train.png", "dmattn_ones.png"):
        with open(os.path.join(folder, png), "rb") as f:
            assert f.read(8) == PNG_SIGNATURE, png
    summary = read(os.path.join(folder, "summary.md"))
    # The speed-up column is peer time / dmattn time from the same CSV row pair.
    assert "| 32768 | 0.20% | 99.8% | 0.5781 | 8.6327 (14.93x)" in summary, summary
    assert "split-q+stage2 (dense) ms (speed-up)" in summary


@test
def plot_dmattn_without_csvs_exits_2(tmp):
    result = run(PLOT_DMATTN, tmp)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


@test
def gemm_ceiling_without_gpu_says_so_in_one_line(tmp):
    # No GPU (CI), or one hidden: a one-line reason and exit 1, never a traceback.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, GEMM_CEILING], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert result.stderr.startswith("gemm_ceiling: ") and result.stderr.count("\n") == 1, result.stderr


def main():
    passed = failed = 0
    for fn in TESTS:
        tmp = tempfile.mkdtemp(prefix="attnlab_plots_")
        try:
            fn(tmp)
            passed += 1
        except Exception as e:  # an assertion or a crash: either way the test failed
            failed += 1
            print(f"FAILED {fn.__name__}: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
