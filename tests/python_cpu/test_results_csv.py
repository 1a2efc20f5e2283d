"""The one results source of a GPU: results_csv.load_gpu's merge rule.

For the same variant and shape the newest `date` wins; on equal dates the
later file in FORWARD_CSVS (fwd.csv, then bench.csv), and within a file the
later line.
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
