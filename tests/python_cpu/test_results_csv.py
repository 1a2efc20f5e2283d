"""The one results source of a GPU: results_csv.load_gpu's merge rule.

For the same variant and shape the newest `date` wins; on equal dates the
later file in FORWARD_CSVS (fwd.csv, then bench.csv), and within a file the
later line. The backward's bwd.csv is read apart (load_bwd), by the same rule.
"""
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import results_csv as rc  # noqa: E402

CSV_A = os.path.join(ROOT, "tests", "fixtures", "results", "FakeGPU-A", "fwd.csv")


def template():
    with open(CSV_A, newline="", encoding="utf-8") as f:
        return next(csv.DictReader(f))


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=rc.COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({**template(), **row})


def tflops_of(rows, variant):
    return [r["tflops"] for r in rows if r["variant"] == variant]


def test_newest_date_wins_whatever_the_file(tmp_path):
    write_csv(tmp_path / "fwd.csv", [dict(variant="split-q+stage2", date="2025-06-03T00:00:00Z", tflops="100")])
    write_csv(tmp_path / "bench.csv", [dict(variant="split-q+stage2", date="2025-06-02T00:00:00Z", tflops="200")])
    assert tflops_of(rc.load_gpu(tmp_path), "split-q+stage2") == [100.0]


def test_equal_dates_go_to_bench_csv_then_the_later_line(tmp_path):
    date = "2025-06-02T00:00:00Z"
    write_csv(tmp_path / "fwd.csv", [dict(variant="split-q+stage2", date=date, tflops="100"),
                                     dict(variant="split-q+stage1", date=date, tflops="1"),
                                     dict(variant="split-q+stage1", date=date, tflops="2")])
    write_csv(tmp_path / "bench.csv", [dict(variant="split-q+stage2", date=date, tflops="200")])
    rows = rc.load_gpu(tmp_path)
    assert tflops_of(rows, "split-q+stage2") == [200.0]
    assert tflops_of(rows, "split-q+stage1") == [2.0]


def test_rows_of_either_file_alone_are_kept(tmp_path):
    write_csv(tmp_path / "fwd.csv", [dict(variant="split-q+stage2", tflops="100")])
    write_csv(tmp_path / "bench.csv", [dict(variant="two-pass+stage4", tflops="500")])
    rows = rc.load_gpu(tmp_path)
    assert sorted(r["variant"] for r in rows) == ["split-q+stage2", "two-pass+stage4"]


def test_gpu_folders_are_those_with_a_forward_csv(tmp_path):
    for name in ("B-gpu", "A-gpu", "no-csv"):
        (tmp_path / name).mkdir()
    write_csv(tmp_path / "B-gpu" / "bench.csv", [{}])
    write_csv(tmp_path / "A-gpu" / "fwd.csv", [{}])
    (tmp_path / "no-csv" / "other.csv").write_text("x\n")
    assert [os.path.basename(f) for f in rc.gpu_folders(tmp_path)] == ["A-gpu", "B-gpu"]
    assert rc.load_gpu(tmp_path / "no-csv") == []


def test_bwd_csv_is_kept_apart_from_the_forward_rows(tmp_path):
    write_csv(tmp_path / "bench.csv", [dict(variant="split-q+stage2", tflops="100")])
    assert rc.load_bwd(tmp_path) is None, "no bwd.csv must read as None, not as no rows"
    write_csv(tmp_path / "bwd.csv", [dict(variant="bwd-ws", date="2025-06-02T00:00:00Z", tflops="400"),
                                     dict(variant="bwd-ws", date="2025-06-03T00:00:00Z", tflops="450"),
                                     dict(variant="sdpa(cudnn) bwd", kind="peer", tflops="420")])
    assert [r["variant"] for r in rc.load_gpu(tmp_path)] == ["split-q+stage2"], "the forward merge read bwd.csv"
    rows = rc.load_bwd(tmp_path)
    assert sorted(r["variant"] for r in rows) == ["bwd-ws", "sdpa(cudnn) bwd"]
    assert tflops_of(rows, "bwd-ws") == [450.0], "the backward rows are not merged by the newest date"


def test_a_folder_with_only_bwd_csv_is_no_forward_gpu_folder(tmp_path):
    (tmp_path / "gpu").mkdir()
    write_csv(tmp_path / "gpu" / "bwd.csv", [dict(variant="bwd-ws", tflops="450")])
    assert rc.gpu_folders(tmp_path) == [] and rc.load_gpu(tmp_path / "gpu") == []
