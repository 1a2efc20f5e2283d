"""scripts/output_excerpt.py: the README's example output is cut from a committed run, rows as printed."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import output_excerpt  # noqa: E402

RULE = "-" * 40
RUN = "\n".join([
    f"{RULE} B=1, H=8, N=8192, D=128, fp16, causal, Warmup: 3, Iters: 20, Seed: 1 {RULE}",
    "   check  vs fp32 reference; causal",
    "   minimal: causal row",
    RULE * 2,
    "GPU X | driver 1 | attnlab abc | 2026-01-01T00:00:00Z",
    f"{RULE} B=1, H=8, N=8192, D=128, fp16, Warmup: 3, Iters: 20, Seed: 2 {RULE}",
    "             check  vs fp32 reference; pass: ...",
    "           unfused: ['1'], time:1.5ms, TFLOPS:182.68 (+0.00%)   baseline",
    "       sdpa(cudnn): ['1'], time:0.4ms, TFLOPS:657.05 (+85.26%)  PASS",
    "           minimal: ['1'], time:14.3ms, TFLOPS:19.20   0.03x sdpa(cudnn)   PASS",
    "   split-q+stage2: ['1'], time:0.9ms, TFLOPS:314.82   0.48x sdpa(cudnn)   PASS",
    "ws+stage2+pingpong: ['1'], time:0.4ms, TFLOPS:654.72   1.00x sdpa(cudnn)   PASS",
    "   two-pass+stage4: unsupported: Dv 128 not in {256, 512, 768, 1024}",
    RULE * 2,
    "GPU Y | driver 2 | attnlab def | 2026-01-02T00:00:00Z",
    ""])


def test_the_non_causal_run_cut_to_its_rows():
    block = output_excerpt.excerpt(RUN, "results/Y/bench.txt").splitlines()
    assert block[1].startswith("From `flash_attn_mma --B 1 --H 8 --N 8192 --D 128") and " on the GPU Y, rows cut" in block[1]
    code = block[block.index("```") + 1:-1]
    assert code[0].endswith("Seed: 2 " + RULE) and code[-1].startswith("GPU Y | ") and code[-2] == RULE * 2
    assert code[1] == "             check  vs fp32 reference; pass: ..."
    assert code[4] == "           minimal: ['1'], time:14.3ms, TFLOPS:19.20   0.03x sdpa(cudnn)   PASS"
    assert not any("split-q" in line or "causal row" in line for line in code)
    assert code[6] == "   two-pass+stage4: unsupported: Dv 128 not in {256, 512, 768, 1024}"


def test_a_missing_row_or_run_is_an_error():
    with pytest.raises(ValueError, match="has no row minimal"):
        output_excerpt.excerpt(RUN.replace("minimal:", "minimul:"), "bench.txt")
    with pytest.raises(ValueError, match="no run of B=1, H=8, N=8192, D=128, fp16"):
        output_excerpt.excerpt(RUN.replace("D=128, fp16, Warmup", "D=64, fp16, Warmup"), "bench.txt")


def test_the_readme_holds_the_block():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert output_excerpt.BEGIN in lines and output_excerpt.END in lines
