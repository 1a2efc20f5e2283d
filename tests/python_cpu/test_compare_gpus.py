"""scripts/compare_gpus.py on two cards: a column group per card, the later card's
best rung over the first's, each row's fraction of its own card's GEMM ceiling
(its gemm_ceiling.txt; backward rows gemm_ceiling_bwd.txt), FlashAttention-4's
rows counted as peers, and "–" where a card has no ceiling file."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_rows import write_rows  # noqa: E402

COMPARE = os.path.join(ROOT, "scripts", "compare_gpus.py")
H100, H200 = "H100-80GB-HBM3", "H200"


def ceiling_file(tflops):
    """The lines of scripts/gemm_ceiling.py's output that compare_gpus reads (its first two)."""
    return f"NVIDIA card | torch 2.11.0+cu130 | CUDA 13.0 | fp16, 8 heads, N = 8192\n" \
           f"square GEMM 8192^3: 1.438 ms, {tflops} TFLOPS\n"


def card(results, name, gpu, rung, cudnn, fa4, bwd_rung, fa4_bwd, ceilings=(None, None)):
    """results/NAME/: bench.csv at B=1 H=8 N=8192 D=128 fp16 (rung 12, sdpa(cudnn), fa4; D = 64 too), bwd.csv
    (rung 14, fa4 bwd) and the GEMM ceiling files given."""
    folder = results / name
    folder.mkdir(parents=True)
    shape = dict(gpu=gpu, D="128", Dv="128", causal="0")
    write_rows(folder / "bench.csv", [
        dict(variant="ws+stage2+pingpong", kind="rung", tflops=str(rung), **shape),
        dict(variant="sdpa(cudnn)", kind="peer", tflops=str(cudnn), **shape),
        dict(variant="fa4", kind="peer", tflops=str(fa4), **shape),
        dict(variant="ws+stage2+pingpong", kind="rung", tflops=str(rung - 100), **{**shape, "D": "64", "Dv": "64"}),
        dict(variant="sdpa(cudnn)", kind="peer", tflops=str(cudnn - 100), **{**shape, "D": "64", "Dv": "64"})])
    write_rows(folder / "bwd.csv", [dict(variant="bwd-ws", kind="rung", tflops=str(bwd_rung), **shape),
                                    dict(variant="fa4 bwd", kind="peer", tflops=str(fa4_bwd), **shape)])
    for text, file in zip(ceilings, ("gemm_ceiling.txt", "gemm_ceiling_bwd.txt")):
        if text is not None:
            (folder / file).write_text(ceiling_file(text), encoding="utf-8")


def compare(tmp_path):
    results = tmp_path / "results"
    card(results, H100, "NVIDIA H100 80GB HBM3", 600, 580, 590, 450, 500, ("700.0", "690.0"))
    card(results, H200, "NVIDIA H200", 650, 640, 660, 480, 520, ("760.0", None))
    result = subprocess.run([sys.executable, COMPARE, "--results", str(results), "--out", str(results)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return (results / "compare_gpus.md").read_text(encoding="utf-8")


def test_two_cards_side_by_side_with_their_ratio_and_gemm_fractions(tmp_path):
    md = compare(tmp_path)
    assert (f"| N | D | causal | {H100} rung | {H100} peer | {H100} ratio | {H100} rung / GEMM | {H200} rung | "
            f"{H200} peer | {H200} ratio | {H200} rung / GEMM | {H200} / {H100} rung |") in md, md
    # D = 128: best peer fa4 on both (590, 660); rung / GEMM 600/700, 650/760; H200 over H100 650/600
    assert "| 8192 | 128 | no | 600.0 | 590.0 | 1.02 | 0.86 | 650.0 | 660.0 | 0.98 | 0.86 | 1.08 |" in md, md
    assert "| 8192 | 64 | no | 500.0 | 480.0 | 1.04 | 0.71 | 550.0 | 540.0 | 1.02 | 0.72 | 1.10 |" in md, md
    assert f"| {H100} | NVIDIA H100 80GB HBM3 | [{H100}/bench.csv]({H100}/bench.csv) |" in md
    assert "| 700.0, 690.0 |" in md and "| 760.0, – |" in md, "the ceilings, and – for a file not there"


def test_every_rung_and_peer_on_both_cards(tmp_path):
    md = compare(tmp_path)
    assert f"| row | {H100} TFLOPS | {H100} / GEMM | {H200} TFLOPS | {H200} / GEMM | {H200} / {H100} |" in md, md
    assert "| 12 `ws` | 600.0 | 0.86 | 650.0 | 0.86 | 1.08 |" in md
    assert "| `fa4` | 590.0 | 0.84 | 660.0 | 0.87 | 1.12 |" in md
    assert "| `sdpa(cudnn)` | 580.0 | 0.83 | 640.0 | 0.84 | 1.10 |" in md
    # backward: over gemm_ceiling_bwd.txt, which the H200 folder lacks
    assert "| 14 `bwd-ws` | 450.0 | 0.65 | 480.0 | – | 1.07 |" in md
    assert "| `fa4 bwd` | 500.0 | 0.72 | 520.0 | – | 1.04 |" in md
    assert "| 00 `minimal` |" not in md, "a rung no card timed at the shape is left out"
