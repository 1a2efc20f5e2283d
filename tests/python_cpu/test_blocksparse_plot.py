"""scripts/blocksparse_table.py's plot (results/<gpu>/blocksparse.png): PNG
bytes with one bar group per (shape, mask, score) case, the same bytes when
drawn again (regenerate.py's rule), and none without rows."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import blocksparse_table as bt  # noqa: E402
import results_rows  # noqa: E402


def write_rows(folder, rows):
    results_rows.write_rows(os.path.join(folder, bt.CSV), rows, ("mask", "score"), B="4", H="16", Nq="4096",
                            Nk="4096", D="128", Dv="128", dtype="bf16", score="none", note="")


def test_plot_is_a_png_drawn_the_same_twice(tmp_path):
    rows = []
    for mask, ours, flex in (("causal", 500, 360), ("document:4", 380, 310), ("dmattn_topk:1024;64", 220, 190)):
        for suffix, scale in (("", 1.0), (" bwd", 0.8)):
            name = bt.DMATTN if mask.startswith(bt.DMATTN) else bt.OURS
            rows.append(dict(variant=name + suffix, kind="rung", tflops=str(ours * scale), mask=mask))
            rows.append(dict(variant=bt.PEER + suffix, kind="peer", tflops=str(flex * scale), mask=mask))
    rows.append(dict(variant=bt.OURS + " bwd", kind="rung", tflops="0", mask="sliding_window:1024;0", status="FAIL"))
    write_rows(tmp_path, rows)
    loaded = bt.load(str(tmp_path))
    png = bt.plot(loaded)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert bt.plot(bt.load(str(tmp_path))) == png


def test_no_plot_without_rows(tmp_path):
    assert bt.plot(bt.load(str(tmp_path))) is None
