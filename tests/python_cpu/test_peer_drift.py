"""scripts/peer_drift.py: each peer's TFLOPS before and after, a shape marked
where a peer moved by more than the threshold, the count on the last line."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import peer_drift  # noqa: E402
from results_rows import write_rows as write_csv  # noqa: E402


def run_set(cudnn, rung, causal="0", D="128"):
    return [dict(variant="sdpa(cudnn) bwd", kind="peer", tflops=str(cudnn), causal=causal, D=D, Dv=D),
            dict(variant="sdpa(flash) bwd", kind="peer", tflops="300", causal=causal, D=D, Dv=D),
            dict(variant="bwd-ws", kind="rung", tflops=str(rung), causal=causal, D=D, Dv=D)]


def drift_of(tmp_path, before, after, *args):
    write_csv(tmp_path / "before.csv", before)
    write_csv(tmp_path / "after.csv", after)
    return peer_drift.main([str(tmp_path / "before.csv"), str(tmp_path / "after.csv"), *args])


def test_a_peer_that_moved_is_marked(tmp_path, capsys):
    assert drift_of(tmp_path, run_set(570, 595), run_set(509, 591)) == 0
    out = capsys.readouterr().out.splitlines()
    assert "sdpa(cudnn) bwd 570.0 -> 509.0 (0.89x)" in out[0]
    assert "rungs (median of 1) 0.99x" in out[0]
    assert out[0].endswith("<-- moved: sdpa(cudnn) bwd")
    assert out[-1] == "peer drift: 1 of 1 shapes (threshold 5 %)"


def test_steady_peers_and_a_faster_rung_are_not_marked(tmp_path, capsys):
    assert drift_of(tmp_path, run_set(570, 560), run_set(574, 595)) == 0
    out = capsys.readouterr().out.splitlines()
    assert "<--" not in out[0]
    assert out[-1] == "peer drift: 0 of 1 shapes (threshold 5 %)"


def test_the_threshold_and_shapes_in_one_run_only(tmp_path, capsys):
    before = run_set(570, 595) + run_set(450, 560, causal="1")
    after = run_set(545, 595) + run_set(450, 560, causal="1", D="64")
    assert drift_of(tmp_path, before, after, "--threshold", "0.02") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2  # the causal D = 128 and D = 64 shapes are each in one run only
    assert out[-1] == "peer drift: 1 of 1 shapes (threshold 2 %)"


def test_an_unreadable_csv_is_one_line_and_exit_2(tmp_path, capsys):
    assert peer_drift.main([str(tmp_path / "missing.csv"), str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("peer_drift.py: cannot read")
