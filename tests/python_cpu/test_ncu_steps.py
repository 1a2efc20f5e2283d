"""CPU tests of scripts/ncu_steps.py: the fields read from an ncu --page raw CSV, and the steps it
profiles (every main-path rung, rung 12's steps in the order its page teaches them).

    python3 -m pytest -q tests/python_cpu/test_ncu_steps.py
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import ladder  # noqa: E402
import ncu_steps  # noqa: E402

RAW = "\n".join([
    "==PROF== Connected to process 123",
    '"ID","Kernel Name","gpu__time_duration.sum",'
    '"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",'
    '"smsp__issue_active.avg.pct_of_peak_sustained_active","l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"',
    '"","","msecond","%","%","","ratio","ratio","ratio","ratio"',
    '"0","ws_kernel","0.41","75.4","31.2","1,234,567","0.8","2.5","9.0","1.1"',
    "==PROF== Disconnected from process 123",
])


def test_reads_the_first_kernels_fields_in_microseconds():
    got = ncu_steps.parse_raw(RAW)
    assert abs(got["duration_us"] - 410.0) < 1e-9, got
    assert got["tensor_pipe_pct"] == 75.4 and got["issue_active_pct"] == 31.2, got
    assert got["smem_wavefronts"] == 1234567.0, got
    # 'selected' is the warp that issued, not a stall
    assert got["top_stall"] == "long_scoreboard" and got["top_stall_ratio"] == 2.5, got


def test_no_kernel_row_is_none():
    assert ncu_steps.parse_raw("==PROF== No kernels were profiled.\n") is None
    header_only = "\n".join(RAW.splitlines()[1:3])
    assert ncu_steps.parse_raw(header_only) is None


def test_missing_metrics_are_none_not_an_error():
    raw = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","usecond"\n"0","k","12.5"\n'
    got = ncu_steps.parse_raw(raw)
    assert got["duration_us"] == 12.5 and got["tensor_pipe_pct"] is None and got["top_stall"] is None, got


def test_the_steps_are_the_main_path_and_rung_12s_steps_in_order():
    rungs = [s[0] for s in ncu_steps.STEPS if not s[3]]
    assert set(rungs) == set(ladder.MAIN_PATH), rungs
    twelve = [s[1] for s in ncu_steps.STEPS if s[0] == ladder.ENGINE]
    assert twelve[:-1] == list(ladder.STEPS["ws"]) and twelve[-1] == "ws+stage2+pingpong", twelve
    assert [s[0] for s in ncu_steps.STEPS if s[3]] == ["13", "14"]


def test_without_ncu_it_says_so_and_exits_3(monkeypatch, capsys):
    monkeypatch.setattr(ncu_steps.shutil, "which", lambda name: None)
    assert ncu_steps.main(["--bin", "/bin/true"]) == 3
    assert "ncu not found" in capsys.readouterr().err
