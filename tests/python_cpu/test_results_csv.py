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


def test_blocksparse_table_pairs_ours_with_flex_of_the_same_case(tmp_path):
    """One line per (shape, mask, score); the ratio only where both rows passed; the newest row wins; dmattn
    is ours on a dmattn_topk mask."""
    import blocksparse_table as bt
    header = ",".join(rc.COLUMNS + ("mask", "score"))

    def line(variant, kind, tflops, status="PASS", mask="causal", score="none", date="2026-12-03T00:00:00Z"):
        fields = {c: "" for c in rc.COLUMNS}
        fields.update(gpu="NVIDIA H200", date=date, variant=variant, kind=kind, B="4", H="16", Nq="4096",
                      Nk="4096", D="128", Dv="128", dtype="bf16", causal="1", time_ms="1.0", tflops=str(tflops),
                      status=status, seed="0")
        return ",".join(fields[c] for c in rc.COLUMNS) + f",{mask},{score}"

    rows = [line("flex_attention", "peer", 300.0), line("blocksparse", "rung", 450.0),
            line("flex_attention bwd", "peer", 250.0), line("blocksparse bwd", "rung", 400.0, status="FAIL"),
            line("blocksparse", "rung", 100.0, date="2026-01-01T00:00:00Z"),  # older: loses
            line("blocksparse", "rung", 200.0, mask="sliding_window:1024;0"),
            line("flex_attention", "peer", 50.0, mask="dmattn_topk:1024;64", score="bias"),
            line("dmattn", "rung", 100.0, mask="dmattn_topk:1024;64", score="bias")]
    (tmp_path / bt.CSV).write_text("\n".join([header] + rows) + "\n")
    text = bt.block(bt.load(str(tmp_path)), "blocksparse.csv")
    causal = next(l for l in text.splitlines() if "`causal`" in l)
    assert "| 450.0 | 300.0 | 1.50× | FAIL | 250.0 | — |" in causal, causal
    window = next(l for l in text.splitlines() if "`sliding_window:1024,0`" in l)
    assert "| 200.0 | — | — |" in window, window
    dmattn = next(l for l in text.splitlines() if "`dmattn_topk:1024,64`" in l)  # dmattn is ours on its masks
    assert "| bias | 100.0 | 50.0 | 2.00× | — | — | — |" in dmattn, dmattn
    assert bt.load(str(tmp_path / "none")) is None
    assert "No block-sparse results yet" in bt.block(None, "x.csv")


def test_an_unsupported_note_reads_as_a_sentence():
    assert rc.note_text("head dims 128 not in {256} (D; or D/Dv)") == "head dim 128 not in {256}"
    assert rc.note_text("head dims 192/128 not in {64; 128; 192/128} (D, or D/Dv)") == \
        "head dims 192/128 not in {64, 128, 192/128}"
    assert rc.note_text("Dv 128 not in {256; 512; 768; 1024}") == "Dv 128 not in {256, 512, 768, 1024}"
    assert rc.note_text("needs sm_90a; this GPU is sm_80") == "needs sm_90a; this GPU is sm_80"
