"""CPU tests of the result scripts: plot.py, compare_gpus.py, doc_tables.py and
plot_dmattn.py on the fixture CSVs; gemm_ceiling.py without a GPU.

    python3 -m pytest -q tests/python_cpu

Needs Python, pytest and matplotlib (no GPU). Runs the scripts as a user
would, on copies in pytest's tmp_path.
"""
import csv
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
PLOT = os.path.join(SCRIPTS, "plot.py")
COMPARE = os.path.join(SCRIPTS, "compare_gpus.py")
DOC_TABLES = os.path.join(SCRIPTS, "doc_tables.py")
PLOT_DMATTN = os.path.join(SCRIPTS, "plot_dmattn.py")
GEMM_CEILING = os.path.join(SCRIPTS, "gemm_ceiling.py")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "results")
GPU_A = os.path.join(FIXTURES, "FakeGPU-A")
CSV_A = os.path.join(GPU_A, "fwd.csv")
PNGS = ("fwd_tflops_vs_N.png", "fwd_tflops_vs_D.png", "fwd_ratio_heatmap.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README = f"# Title\n\nIntro.\n\n{BEGIN}\nstale text\n{END}\n\nAfter the block.\n"

sys.path.insert(0, SCRIPTS)


def run(script, *args):
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True, timeout=300)


def expect_ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def fixture_commit():
    with open(CSV_A, newline="", encoding="utf-8") as f:
        return next(csv.DictReader(f))["commit"]


def plot_with_readme(tmp, folder=GPU_A):
    """Runs plot.py on `folder` into tmp/img with tmp/README.md; returns (result, readme path)."""
    readme = tmp / "README.md"
    write(readme, README)
    return run(PLOT, folder, "--out", tmp / "img", "--readme", readme), readme


def test_plot_writes_three_pngs(tmp_path):
    result, _ = plot_with_readme(tmp_path)
    expect_ok(result)
    for name in PNGS:
        path = tmp_path / "img" / name
        assert path.is_file(), f"{name} not written"
        assert path.stat().st_size > 5 * 1024, f"{name} is only {path.stat().st_size} bytes"
        assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{name} is not a PNG"
        assert str(path) in result.stdout, f"plot.py did not report writing {name}"


def test_plot_replaces_readme_block(tmp_path):
    result, readme = plot_with_readme(tmp_path)
    expect_ok(result)
    text = read(readme)
    assert "stale text" not in text, "old block kept"
    assert text.startswith("# Title\n\nIntro.\n\n") and text.endswith("\n\nAfter the block.\n"), "text outside changed"
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "markers not kept exactly once"
    block = text[text.index(BEGIN):text.index(END)]
    assert "| D | causal | best rung | TFLOPS |" in block, "table header missing"
    assert "\n| 64 | no | `split-q+stage2` | 263.1 |" in block, "no (or wrong) row for D=64"
    assert "NVIDIA Fake GPU A" in block and fixture_commit() in block, "GPU or commit missing"
    for name in PNGS:
        assert f"(img/{name})" in block, f"no relative link to {name}"


def test_plot_keeps_last_measurement_and_marks_unsupported(tmp_path):
    result, readme = plot_with_readme(tmp_path)
    expect_ok(result)
    rows = [line for line in read(readme).splitlines() if line.startswith("| 512 | no |")]
    assert len(rows) == 1, f"expected one D=512 non-causal row, got {rows}"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == "–" and cells[-1] == "–", f"D=512 has no rung, got {cells}"
    # Peers are sorted: sdpa(cudnn), sdpa(efficient), sdpa(flash), torch(unfused), unfused.
    assert cells[4] == "–" and cells[6] == "–", f"cudnn and flash are unsupported at D=512, got {cells}"


def test_plot_takes_rungs_that_only_bench_csv_has(tmp_path):
    # One source per GPU: a rung that only gpu_check's bench.csv timed is in the table.
    folder = tmp_path / "gpu"
    folder.mkdir()
    shutil.copy(CSV_A, folder / "fwd.csv")
    with open(CSV_A, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        row = next(r for r in reader if r["variant"] == "split-q+stage2" and r["D"] == "512" and r["Nq"] == "8192"
                   and r["causal"] == "0")
    row.update(variant="two-pass+stage4", date="2025-07-01T00:00:00Z", time_ms="1.0", tflops="500.00",
               status="PASS", note="")
    with open(folder / "bench.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    result, readme = plot_with_readme(tmp_path, folder)
    expect_ok(result)
    text = read(readme)
    assert "\n| 512 | no | `two-pass+stage4` | 500.0 |" in text, text
    assert "`gpu/fwd.csv`, `gpu/bench.csv`" in text, text


def test_plot_rerun_gives_identical_readme_and_pngs(tmp_path):
    result, readme = plot_with_readme(tmp_path)
    expect_ok(result)
    first = read(readme)
    pngs = {name: (tmp_path / "img" / name).read_bytes() for name in PNGS}
    expect_ok(run(PLOT, GPU_A, "--out", tmp_path / "img", "--readme", readme))
    assert read(readme) == first, "second run changed the README"
    for name in PNGS:
        assert (tmp_path / "img" / name).read_bytes() == pngs[name], f"second run changed {name}"


def test_plot_without_markers_exits_2(tmp_path):
    readme = tmp_path / "README.md"
    write(readme, "# No markers here\n")
    result = run(PLOT, GPU_A, "--out", tmp_path / "img", "--readme", readme)
    assert result.returncode == 2, f"exit {result.returncode}, wanted 2\n{result.stderr}"
    assert len(result.stderr.strip().splitlines()) == 1 and "markers" in result.stderr, result.stderr
    assert read(readme) == "# No markers here\n", "README without markers was modified"


def test_plot_header_only_csv_skips_plots(tmp_path):
    with open(CSV_A, encoding="utf-8") as f:
        write(tmp_path / "fwd.csv", f.readline())
    result = run(PLOT, tmp_path)
    expect_ok(result)
    assert "skipped" in result.stdout and not any(n in os.listdir(tmp_path) for n in PNGS), result.stdout


def fake_slice(variants_at_n):
    """A Slice of fake rows: {variant: [N, ...]} timed at D=128 non-causal, TFLOPS = N / 100."""
    import results_csv as rc
    with open(CSV_A, newline="", encoding="utf-8") as f:
        template = next(csv.DictReader(f))
    rows = []
    for variant, ns in variants_at_n.items():
        for n in ns:
            kind = "peer" if variant.startswith(("sdpa", "torch")) or variant == "unfused" else "rung"
            row = rc._parse(dict(template, variant=variant, kind=kind,
                                 Nq=str(n), Nk=str(n), D="128", Dv="128", causal="0", tflops=f"{n / 100}",
                                 status="PASS"), "fake")
            rows.append(row)
    return rc.forward_slice(rows)


def test_plot_draws_a_variant_timed_once_as_a_lone_marker_and_hides_none():
    import matplotlib.pyplot as plt
    import plot
    sl = fake_slice({"sdpa(flash)": [1024, 2048, 4096], "split-q+stage2": [1024, 2048, 4096],
                     "two-pass+stage4": [2048]})
    styles = plot.variant_styles(sl)
    fig = plot.plot_vs_n(sl, styles)
    legend = {h.get_label(): h for h in fig.legends[0].legend_handles}
    plt.close(fig)
    assert set(legend) == {"sdpa(flash)", "split-q+stage2", "two-pass+stage4 (N=2K only)"}, legend
    assert legend["two-pass+stage4 (N=2K only)"].get_linestyle() == "None", "a lone point drawn as a line"
    assert legend["split-q+stage2"].get_linestyle() != "None"


def test_plot_colours_follow_the_rung_family():
    import plot
    sl = fake_slice({"sdpa(flash)": [1024], "unfused": [1024], "split-kv+stage1": [1024], "split-q+stage1": [1024],
                     "split-q+stage2": [1024], "wgmma+stage2": [1024], "ws+stage2": [1024],
                     "two-pass+stage4": [1024]})
    colour = {v: tuple(plot.matplotlib.colors.to_rgb(s["color"])) for v, s in plot.variant_styles(sl).items()}
    for peer in ("sdpa(flash)", "unfused"):
        r, g, b = colour[peer]
        assert r == g == b, f"peer {peer} is not grey: {colour[peer]}"
    assert colour["split-q+stage1"] == colour["split-q+stage2"], "stages of one rung differ in colour"
    for variant in ("split-kv+stage1", "split-q+stage1"):  # rungs 00-06: blue
        r, g, b = colour[variant]
        assert b > r and b > g, f"{variant}: {colour[variant]}"
    for variant in ("wgmma+stage2", "ws+stage2"):  # rungs 07 and 12: green
        r, g, b = colour[variant]
        assert g > r and g > b, f"{variant}: {colour[variant]}"
    r, g, b = colour["two-pass+stage4"]  # rung 11: orange
    assert r > g > b, colour["two-pass+stage4"]


def test_compare_gpus_writes_md_and_png(tmp_path):
    result = run(COMPARE, "--results", FIXTURES, "--out", tmp_path)
    expect_ok(result)
    md, png = tmp_path / "compare_gpus.md", tmp_path / "compare_gpus.png"
    assert md.is_file() and png.is_file(), f"outputs missing\n{result.stdout}"
    assert png.read_bytes()[:8] == PNG_SIGNATURE, "compare_gpus.png is not a PNG"
    text = read(md)
    assert "FakeGPU-A" in text and "FakeGPU-B" in text, "md does not name both GPUs"
    assert "| 8192 | 64 | no |" in text, "no N=8192, D=64 row"


def test_compare_gpus_works_with_one_gpu(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(os.path.join(FIXTURES, "FakeGPU-B"), results / "FakeGPU-B")
    (results / "empty-folder").mkdir()
    result = run(COMPARE, "--results", results, "--out", results)
    expect_ok(result)
    assert "empty-folder" in result.stdout, "folder without forward CSVs not reported"
    assert "FakeGPU-B" in read(results / "compare_gpus.md")


def test_doc_tables_fills_a_rung_page(tmp_path):
    page, other = tmp_path / "02_split_q.md", tmp_path / "other.md"
    write(page, "# Rung\n\n<!-- numbers: split-q prev=split-kv -->\nstale\n<!-- numbers:end -->\n\nAfter.\n")
    write(other, "no markers here\n")
    expect_ok(run(DOC_TABLES, GPU_A, page, other))
    text = read(page)
    assert "stale" not in text and "After." in text, text
    assert "| stage1 | stage2 |" in text, "no stage columns"
    assert "| 1,8,8192,8192,64 | fp16 | no |" in text, "no D=64 dense row"
    assert "sdpa(cudnn)" in text and "best stage / sdpa(flash)" in text, text
    assert read(other) == "no markers here\n", "a page without markers was changed"
    expect_ok(run(DOC_TABLES, GPU_A, page))
    assert read(page) == text, "rerun changed the page"


def test_doc_tables_lists_the_plotted_shapes_at_n_8192_only(tmp_path):
    page = tmp_path / "02_split_q.md"
    write(page, "<!-- numbers: split-q -->\n<!-- numbers:end -->\n")
    expect_ok(run(DOC_TABLES, GPU_A, page))
    text = read(page)
    assert "| 1,8,1024,1024,64 |" not in text, "a plotted shape at N != 8192 is listed"
    assert "| 4,16,1024,1024,64 | fp16 | no |" in text, "a shape off the plots is not listed"
    assert "| 1,8,8192,8192,128 | bf16 | no |" in text, "a bf16 shape is not listed"


def test_doc_tables_ends_with_the_verdict_against_prev(tmp_path):
    page = tmp_path / "02_split_q.md"
    write(page, "<!-- numbers: split-q prev=split-q -->\n<!-- numbers:end -->\n")
    expect_ok(run(DOC_TABLES, GPU_A, page))
    lines = read(page).splitlines()
    assert lines[-1] == "<!-- numbers:end -->", lines
    assert lines[-2] == ("Best stage against best split-q at N=8192, B=1, H=8, fp16 (same runs): "
                         "D=64 1.00× (causal 1.00×), D=128 1.00× (causal 1.00×)."), lines[-2]


def test_doc_tables_says_when_a_rung_has_no_rows(tmp_path):
    # A rung newer than the CSVs: one sentence, not an empty table with "TFLOPS on –".
    page = tmp_path / "12_ws_pingpong.md"
    write(page, "<!-- numbers: no-such-rung prev=split-q -->\nstale\n<!-- numbers:end -->\n")
    expect_ok(run(DOC_TABLES, GPU_A, page))
    text = read(page)
    assert "The results CSV has no timed row of this rung." in text and "|" not in text, text


BWD_PAGE = ("# Rung 14\n\n<!-- numbers: bwd-ws prev=bwd-mma -->\nstale\n<!-- numbers:end -->\n\n"
            "<!-- numbers: bwd-mma -->\n<!-- numbers:end -->\n\nAfter.\n")


def test_doc_tables_fills_a_backward_page_from_bwd_csv(tmp_path):
    page = tmp_path / "14_bwd_ws.md"
    write(page, BWD_PAGE)
    expect_ok(run(DOC_TABLES, GPU_A, page))
    text = read(page)
    assert "stale" not in text and text.endswith("<!-- numbers:end -->\n\nAfter.\n"), text
    assert ("| B,H,Nq,Nk,D | dtype | causal | bwd-ws | deterministic | best bwd-mma | best peer | "
            "best variant / best peer | best variant / sdpa(cudnn) bwd | best variant / sdpa(flash) bwd |") in text, text
    # 450 / 420 (cuDNN's backward, the best peer) and / 300 (FlashAttention-2's); bwd-mma's best 330.
    assert "| 1,8,8192,8192,128 | fp16 | no | 450.0 | 430.0 | 330.0 (bwd-mma) | 420.0 sdpa(cudnn) bwd | 1.07 | 1.07 | 1.50 |" \
        in text, text
    assert "| 1,8,8192,8192,128 | fp16 | yes | 410.0 | FAIL |" in text, "a FAILed row is not shown as FAIL"
    assert "| 1,32/8,8192,8192,128 | fp16 | yes |" in text, "no GQA row"
    assert "Not run at head dims 192, 256 (unsupported" in text, text
    assert "Best variant against best bwd-mma at N=8192, B=1, H=8, fp16 (same runs): D=64 1.29×, D=128 1.36× " \
           "(causal 1.41×)." in text, text
    assert "| 1,8,8192,8192,64 | fp16 | no | 280.0 | 240.0 | 330.0 sdpa(cudnn) bwd | 0.85 | 0.85 | 1.12 |" in text
    assert "split-q" not in text and "sdpa(flash) |" not in text, "forward rows in a backward table"
    expect_ok(run(DOC_TABLES, GPU_A, page))
    assert read(page) == text, "rerun changed the page"


def test_doc_tables_says_when_there_is_no_bwd_csv(tmp_path):
    page = tmp_path / "14_bwd_ws.md"
    write(page, BWD_PAGE)
    expect_ok(run(DOC_TABLES, os.path.join(FIXTURES, "FakeGPU-B"), page))
    text = read(page)
    assert text.count("The results have no bwd.csv") == 2 and "|" not in text, text


def test_ladder_keeps_the_backward_rungs_to_their_own_table():
    import ladder
    import results_csv as rc
    forward = ladder.ladder_block(rc.load_gpu(GPU_A), "results/A", "")
    assert "| 12 `ws` |" in forward and "bwd-" not in forward, forward
    backward = ladder.ladder_block(rc.load_bwd(GPU_A), "results/A", "", backward=True)
    assert "| 13 `bwd-mma` |" in backward and "| 12 `ws` |" not in backward, backward
    missing = ladder.ladder_block(None, "results/B", "", backward=True)
    assert "results/B has no bwd.csv" in missing and "|" not in missing, missing


def test_plot_dmattn_writes_pngs_and_summary(tmp_path):
    folder = tmp_path / "dmattn"
    shutil.copytree(os.path.join(GPU_A, "dmattn"), folder)
    expect_ok(run(PLOT_DMATTN, folder))
    for png in ("dmattn_train.png", "dmattn_ones.png"):
        assert (folder / png).read_bytes()[:8] == PNG_SIGNATURE, png
    summary = read(folder / "summary.md")
    # The speed-up column is peer time / dmattn time from the same CSV row pair.
    assert "| 32768 | 0.20% | 99.8% | 0.5781 | 8.6327 (14.93x)" in summary, summary
    assert "split-q+stage2 (dense) ms (speed-up)" in summary


def test_plot_dmattn_without_csvs_exits_2(tmp_path):
    result = run(PLOT_DMATTN, tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


def test_gemm_ceiling_without_gpu_says_so_in_one_line():
    # No GPU (CI), or one hidden: a one-line reason and exit 1, never a traceback.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, GEMM_CEILING], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert result.stderr.startswith("gemm_ceiling: ") and result.stderr.count("\n") == 1, result.stderr


def test_a_rungs_steps_come_first_in_the_order_its_page_teaches():
    import ladder
    names = ["ws+stage2+pingpong", "ws+tma+pingpong+persistent", "ws+stage2", "ws+tma", "ws+tma+pingpong"]
    ordered = sorted(names, key=lambda v: ladder.stage_order("ws", v))
    assert ordered == ["ws+tma", "ws+tma+pingpong", "ws+tma+pingpong+persistent", "ws+stage2",
                       "ws+stage2+pingpong"], ordered
    assert sorted(["split-q+stage2", "split-q+stage1"], key=lambda v: ladder.stage_order("split-q", v)) == [
        "split-q+stage1", "split-q+stage2"]
