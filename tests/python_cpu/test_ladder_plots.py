"""CPU tests of the plots that tell the ladder (scripts/plot.py, scripts/ladder.py): the main path's
bar chart, the heat map that names only rungs that ran in a cell, the line plots split into main
path and side branches, and the runs every merged table and plot names.

    python3 -m pytest -q tests/python_cpu/test_ladder_plots.py

Needs Python, pytest and matplotlib (no GPU). Rows are made from the fake GPU's fixture row.
"""
import csv
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
GPU_A = os.path.join(ROOT, "tests", "fixtures", "results", "FakeGPU-A")
sys.path.insert(0, SCRIPTS)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import ladder  # noqa: E402
import plot  # noqa: E402
import results_csv as rc  # noqa: E402
from results_rows import write_rows  # noqa: E402

RUN_A = dict(commit="aaaaaaa", date="2025-06-01T10:00:00Z")
RUN_B = dict(commit="bbbbbbb", date="2025-06-03T10:00:00Z")
PEERS = ("sdpa(cudnn)", "sdpa(flash)", "unfused")


def template():
    with open(os.path.join(GPU_A, "fwd.csv"), newline="", encoding="utf-8") as f:
        return next(csv.DictReader(f))


def make_row(variant, tflops, n=8192, d=128, causal=0, run=RUN_A, status="PASS", note=""):
    kind = "peer" if variant in PEERS or variant.startswith(("sdpa", "torch")) else "rung"
    raw = dict(template(), variant=variant, kind=kind, B="1", H="8", Nq=str(n), Nk=str(n), D=str(d), Dv=str(d),
               dtype="fp16", causal=str(causal), tflops="" if tflops is None else str(tflops),
               time_ms="" if tflops is None else "1.0", status=status, note=note, **run)
    return rc._parse(raw, "fake")


def ladder_rows(causal=0, run=RUN_A, peers_run=None):
    """Every main-path rung at ladder.SHAPE, two variants of the engine, FA2 and cuDNN, and a side branch."""
    rows = [make_row(v, t, causal=causal, run=run) for v, t in (
        ("minimal", 20), ("split-kv+stage1", 150), ("split-kv+stage2", 170), ("split-q+stage2", 300),
        ("share-kv+stage2", 290), ("wgmma+stage2+overlap", 420), ("ws+stage2", 630), ("ws+stage2+pingpong", 650))]
    rows += [make_row("sdpa(flash)", 350, causal=causal, run=peers_run or run),
             make_row("sdpa(cudnn)", 660, causal=causal, run=peers_run or run)]
    return rows


# ---- the main path ------------------------------------------------------------------------


def test_the_main_path_is_the_engines_lineage():
    assert ladder.MAIN_PATH == ("00", "01", "02", "07", "12"), ladder.MAIN_PATH
    assert ladder.on_main_path("ws+stage2+pingpong") and ladder.on_main_path("minimal")
    for variant in ("share-kv+stage2", "tiling-qk+stage1", "two-pass+stage4", "sdpa(flash)", "no-such-rung"):
        assert not ladder.on_main_path(variant), variant


def test_main_path_bars_take_each_rungs_best_stage_and_every_engine_variant():
    bars = plot.main_path_bars(ladder_rows(), 0)
    shown = [(rung.number, row and row["variant"]) for rung, row, _ in bars]
    assert shown == [("00", "minimal"), ("01", "split-kv+stage2"), ("02", "split-q+stage2"),
                     ("07", "wgmma+stage2+overlap"), ("12", "ws+stage2"), ("12", "ws+stage2+pingpong")], shown


def test_main_path_bars_say_why_a_rung_has_no_bar():
    rows = [r for r in ladder_rows() if r["variant"] != "minimal"]
    rows.append(make_row("minimal", None, d=64, status="unsupported", note="head dim 64 not in {128}"))
    bars = plot.main_path_bars(rows, 0)
    assert bars[0][0].number == "00" and bars[0][1] is None and bars[0][2] == "not run at this shape", bars[0]


def bar_chart_texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]


def test_the_bar_chart_draws_both_masks_with_fa2_and_cudnn_as_lines():
    rows = ladder_rows(0) + ladder_rows(1)
    fig = plot.plot_main_path(rows, rc.run_names(rows))
    axes = fig.axes
    try:
        assert [ax.get_title() for ax in axes] == ["non-causal", "causal"]
        for ax in axes:
            assert len(ax.patches) == 6, "one bar per main-path rung, two for the engine"
            levels = sorted(line.get_ydata()[0] for line in ax.lines)
            assert levels == [350, 660], levels
            ticks = [t.get_text() for t in ax.get_xticklabels()]
            assert ticks[-2:] == ["12 ws\nstage2", "12 ws\nstage2+pingpong"], ticks
        texts = bar_chart_texts(fig)
        assert "FA2 (sdpa flash): 350.0" in texts and "cuDNN (sdpa cudnn): 660.0" in texts, texts
        caption = fig.get_supxlabel()
        assert "one run: commit aaaaaaa, 2025-06-01" in caption, caption
    finally:
        plt.close(fig)


def test_the_bar_chart_letters_each_bar_with_its_run_when_runs_are_mixed():
    rows = ladder_rows(0, run=RUN_A, peers_run=RUN_B)
    fig = plot.plot_main_path(rows, rc.run_names(rows))
    try:
        (ax,) = fig.axes  # only the non-causal rows: one panel
        assert all(t.get_text().endswith("\nrun a") for t in ax.get_xticklabels()), ax.get_xticklabels()
        assert "FA2 (sdpa flash): 350.0, run b" in bar_chart_texts(fig)
        caption = fig.get_supxlabel().replace("\n", " ")
        assert "a = commit aaaaaaa, 2025-06-01" in caption and "b = commit bbbbbbb, 2025-06-03" in caption, caption
    finally:
        plt.close(fig)


def test_the_ladder_block_shows_the_bar_chart_and_a_run_column_when_runs_are_mixed():
    one = ladder.ladder_block(ladder_rows(), "results/X", "", image="../results/X/fwd_main_path.png")
    assert one.endswith("\n\n![The main path at this shape, rung by rung, with FlashAttention-2 and cuDNN as lines]"
                        "(../results/X/fwd_main_path.png)"), one
    assert "(commit aaaaaaa, 2025-06-01)" in one and "| run |" not in one, one
    mixed = ladder.ladder_block(ladder_rows(run=RUN_A, peers_run=RUN_B), "results/X", "")
    assert "runs a = commit aaaaaaa, 2025-06-01; b = commit bbbbbbb, 2025-06-03" in mixed, mixed
    assert "| × cuDNN | run |" in mixed and "| 0.98 | a, b |" in mixed, mixed  # rung 12 over cuDNN, two runs
    assert "![" not in mixed, "an image without one given"



def test_the_ladder_block_shows_each_main_path_steps_profile_when_there_are_profiles(tmp_path):
    plain = ladder.ladder_block(ladder_rows(), "results/X", "")
    assert "tensor pipe" not in plain, "profile columns without profiles"
    (tmp_path / ladder.PROFILES_CSV).write_text(
        "rung,variant,direction,B,H,N,D,dtype,duration_us,tensor_pipe_pct,issue_active_pct,smem_wavefronts,"
        "top_stall,top_stall_ratio,note\n"
        "07,wgmma+stage2+overlap,fwd,1,8,8192,128,fp16,600,55.5,30,100,barrier,1.25,\n"
        "12,ws+tma,fwd,1,8,8192,128,fp16,430,70,30,100,wait,0.5,\n"
        "12,ws+stage2+pingpong,fwd,1,8,8192,128,fp16,418,75.4,31,100,long_scoreboard,2.5,\n"
        "02,split-q+stage2,fwd,1,8,8192,128,fp16,,,,,,,no kernel profiled: x\n")
    profiles = ladder.load_profiles(str(tmp_path))
    assert profiles[("12", "fwd")]["variant"] == "ws+stage2+pingpong", "a rung's last step is its profile"
    block = ladder.ladder_block(ladder_rows(), "results/X", "", profiles=profiles)
    assert "| × cuDNN | tensor pipe | top stall |" in block and "ncu_steps.csv" in block, block
    rows = {line.split(" | ")[0]: line for line in block.splitlines() if line.startswith("| ")}
    assert "| 75.4 % | long_scoreboard (2.50) |" in rows["| 12 `ws`"], rows["| 12 `ws`"]
    assert "| 55.5 % | barrier (1.25) |" in rows["| 07 `wgmma`"], rows["| 07 `wgmma`"]


# ---- the heat map -----------------------------------------------------------------------


def heatmap_slice():
    """Rung 07 at N = 1K and 8K, the engine (12) at 8K only, rung 00 at 8K only and slower: a heat map
    that must not call rung 07 the best at 1K without saying that 12 did not run there."""
    rows = []
    for n, run in ((1024, RUN_A), (8192, RUN_B)):
        rows += [make_row("wgmma+stage2", 300 if n == 1024 else 420, n=n, run=run),
                 make_row("sdpa(cudnn)", 500 if n == 1024 else 660, n=n, run=run)]
    rows += [make_row("ws+stage2", 650, run=RUN_B), make_row("minimal", 20, run=RUN_B)]
    return rc.forward_slice(rows), rc.run_names(rows)


def test_a_heatmap_cell_says_which_winning_rung_did_not_run_there():
    sl, names = heatmap_slice()
    (small, large), = zip(*plot.ratio_grid(sl, 0, [1024, 8192], [128], names))  # one D column
    assert small.label == "rung 07" and small.not_run == ["12"], vars(small)
    assert abs(small.value - 300 / 500) < 1e-9 and small.runs == "a", vars(small)
    assert large.label == "rung 12" and large.not_run == [] and large.runs == "b", vars(large)


def test_the_heatmap_hatches_the_cells_without_the_winner_and_names_its_runs():
    sl, names = heatmap_slice()
    fig = plot.plot_ratio_heatmap(sl, names=names)
    try:
        (ax,) = [a for a in fig.axes if a.get_title() == "non-causal"]
        texts = [t.get_text() for t in ax.texts]
        assert "0.60\nrung 07\n12 not run\nrun a" in texts and "0.98\nrung 12\nrun b" in texts, texts
        hatched = [p for p in ax.patches if p.get_hatch()]
        assert len(hatched) == 1 and hatched[0].get_xy() == (-0.5, -0.5), hatched
        caption = fig.get_supxlabel().replace("\n", " ")
        assert "12 not run" in caption and "a = commit aaaaaaa, 2025-06-01" in caption, caption
    finally:
        plt.close(fig)


# ---- the line plots: main path and side branches ---------------------------------------


def split_slice():
    rows = []
    for n in (1024, 8192):
        rows += [make_row(v, t, n=n) for v, t in (("split-q+stage2", 300), ("wgmma+stage2", 400),
                                                  ("share-kv+stage2", 290), ("sdpa(flash)", 350))]
    rows += [make_row("two-pass+stage4", 600, d=512), make_row("sdpa(flash)", 100, d=512)]
    return rc.forward_slice(rows)


def legend_labels(fig):
    return [h.get_label() for h in fig.legends[0].legend_handles]


def test_main_path_and_side_branches_are_drawn_apart_with_the_peers_in_both():
    sl = split_slice()
    main, side = plot.split_styles(sl, plot.variant_styles(sl))
    assert list(main) == ["sdpa(flash)", "split-q+stage2", "wgmma+stage2"], list(main)
    assert list(side) == ["sdpa(flash)", "share-kv+stage2", "two-pass+stage4"], list(side)
    fig = plot.plot_vs_n(sl, main, plot.MAIN_PATH)
    try:
        assert legend_labels(fig) == ["sdpa(flash)", "split-q+stage2", "wgmma+stage2"], legend_labels(fig)
        titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
        assert titles == ["D=128, non-causal"], "a head dim without main-path rows is drawn: " + str(titles)
        assert "main path (rungs 02, 07)" in fig.get_suptitle(), fig.get_suptitle()
        assert "rungs 03" not in fig.legends[0].get_title().get_text()
    finally:
        plt.close(fig)
    fig = plot.plot_vs_n(sl, side, plot.SIDE)
    try:
        assert legend_labels(fig) == ["sdpa(flash)", "share-kv+stage2", "two-pass+stage4 (N=8K only)"]
        assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["D=128, non-causal", "D=512, non-causal"]
    finally:
        plt.close(fig)


def test_many_head_dims_wrap_into_rows_of_three_panels():
    rows = [make_row(v, 100 + d / 10, d=d) for d in (32, 64, 128, 256, 512) for v in ("tiling-qk+stage1",
                                                                                        "sdpa(cudnn)")]
    sl = rc.forward_slice(rows)
    fig = plot.plot_vs_n(sl, plot.split_styles(sl, plot.variant_styles(sl))[1], plot.SIDE)
    try:
        shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
        assert len(shown) == 5 and len(fig.axes) == 6, (len(shown), len(fig.axes))  # 2 rows of 3, the last empty
        assert not fig.axes[5].get_visible() and fig.axes[3].get_title() == "D=256, non-causal"
    finally:
        plt.close(fig)


# ---- runs -----------------------------------------------------------------------------------


def test_runs_are_lettered_in_the_order_they_started():
    rows = [make_row("sdpa(flash)", 1, run=RUN_B), make_row("split-q+stage2", 1, run=RUN_A),
            make_row("wgmma+stage2", 1, run=dict(RUN_A, date="2025-06-01T11:30:00Z"))]  # same commit, same day
    names = rc.run_names(rows)
    assert names == {("aaaaaaa", "2025-06-01"): "a", ("bbbbbbb", "2025-06-03"): "b"}, names
    assert rc.runs_label(rows, names) == "a, b" and rc.runs_label(rows[1:], names) == "a"
    assert rc.runs_legend(names) == "a = commit aaaaaaa, 2025-06-01; b = commit bbbbbbb, 2025-06-03"


def test_the_results_table_names_each_rows_run_when_it_merges_runs():
    rows = [make_row(v, t, d=64, run=RUN_A) for v, t in (("split-q+stage2", 300), ("sdpa(flash)", 350))]
    rows += [make_row(v, t, d=128, run=RUN_B) for v, t in (("split-q+stage2", 310), ("sdpa(flash)", 340))]
    rows += [make_row("sdpa(cudnn)", 500, d=128, run=RUN_A)]
    lines = plot.results_table(rc.forward_slice(rows), rc.run_names(rows))
    assert "lettered in the run column: a = commit aaaaaaa, 2025-06-01; b = commit bbbbbbb, 2025-06-03" in lines[0]
    assert lines[2].endswith("| ratio to best peer | run |"), lines[2]
    assert lines[4].startswith("| 64 | no |") and lines[4].endswith("| a |"), lines[4]
    assert lines[5].startswith("| 128 | no |") and lines[5].endswith("| a, b |"), lines[5]  # cuDNN from run a
    one = plot.results_table(rc.forward_slice(rows[:2]), rc.run_names(rows[:2]))
    assert one[0].endswith("Every row from one run: commit aaaaaaa, 2025-06-01.") and "run |" not in one[2], one


# ---- the files ----------------------------------------------------------------------------

NEW_PNGS = ("fwd_main_path.png", "fwd_tflops_vs_N_side.png", "fwd_tflops_vs_D_side.png")


def test_plot_writes_every_ladder_plot_and_the_same_bytes_twice(tmp_path):
    folder = tmp_path / "gpu"
    folder.mkdir()
    shutil.copy(os.path.join(GPU_A, "fwd.csv"), folder / "fwd.csv")
    extra = [dict(variant=v, kind="rung", Nq=str(n), Nk=str(n), D="128", Dv="128", causal="0", tflops=str(t),
                  time_ms="1.0") for v, t in (("share-kv+stage2", 280), ("ws+stage2", 600)) for n in (1024, 8192)]
    write_rows(folder / "bench.csv", extra, B="1", H="8", dtype="fp16", date="2025-07-01T00:00:00Z",
               commit="ccccccc", note="")
    out = tmp_path / "img"

    def draw():
        result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "plot.py"), str(folder), "--out", str(out)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return {name: (out / name).read_bytes() for name in NEW_PNGS + plot.RESULTS_PLOTS}

    first = draw()
    assert draw() == first, "a second run drew different bytes"
    for name, data in first.items():
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and b"Software\x00matplotlib " + matplotlib.__version__.encode() \
            in data, name
