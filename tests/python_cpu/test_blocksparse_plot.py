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


def test_flex_on_flash_kernels_is_a_second_peer_where_it_ran(tmp_path):
    """flex_attention(flash) rows (bench_blocksparse.py's second flex peer) get their own columns and bars; our
    ratio is to the faster flex that passed; a case torch refused on that backend shows `unsupported`."""
    rows = []
    for mask, ours, flex, flash in (("causal", 480, 305, 376), ("prefix_lm:512", 400, 300, None)):
        for suffix, scale in (("", 1.0), (" bwd", 0.9)):
            rows.append(dict(variant=bt.OURS + suffix, kind="rung", tflops=str(ours * scale), mask=mask))
            rows.append(dict(variant=bt.PEER + suffix, kind="peer", tflops=str(flex * scale), mask=mask))
            rows.append(dict(variant=bt.FLASH_PEER + suffix, kind="peer", mask=mask,
                             **(dict(tflops=str(flash * scale)) if flash else dict(tflops="", status="unsupported"))))
    write_rows(tmp_path, rows)
    text = bt.block(bt.load(str(tmp_path)), "blocksparse.csv")
    assert ("| shape | mask_mod | score_mod | ours fwd | flex fwd | flex FLASH fwd | × | ours bwd | flex bwd | "
            "flex FLASH bwd | × |") in text, text
    assert "|---|---|---|---|---|---|---|---|---|---|---|" in text
    # causal: over flex FLASH (376 > 305), 480 / 376 and 432 / 338.4
    assert "| `causal` | none | 480.0 | 305.0 | 376.0 | 1.28× | 432.0 | 274.5 | 338.4 | 1.28× |" in text, text
    assert "| `prefix_lm:512` | none | 400.0 | 300.0 | unsupported | 1.33× |" in text, text
    png = bt.plot(bt.load(str(tmp_path)))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == bt.plot(bt.load(str(tmp_path)))
