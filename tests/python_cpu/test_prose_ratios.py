"""A ratio in a rung page's prose must lie within its generated table's range (scripts/prose_ratios.py),
and scripts/regenerate.py --check fails when one does not."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import prose_ratios  # noqa: E402
import regenerate  # noqa: E402
import results_csv as rc  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "results", "FakeGPU-A")
# The fixture's split-q rows at N = 8192 (best stage over sdpa(flash)): D = 64 0.79 (causal too), D = 128 0.83;
# over sdpa(cudnn): 0.57-0.58. Its bwd-mma rows over sdpa(flash) bwd: 1.10-1.16.
RUNG02 = "# Rung 02\n\n<!-- numbers: split-q prev=split-kv -->\n<!-- numbers:end -->\n\n"
RUNG13 = "# Rung 13\n\n<!-- numbers: bwd-mma -->\n<!-- numbers:end -->\n\n"


@pytest.fixture(scope="module")
def rows():
    return rc.load_gpu(FIXTURE), rc.load_bwd(FIXTURE)


def problems(text, rows, page="docs/02_split_q.md"):
    return prose_ratios.check_text(text, page, *rows)


@pytest.mark.parametrize("prose", [
    "Against FlashAttention-2 (`sdpa(flash)`) it reaches 0.79–0.83×.",
    "It reaches 0.79× FlashAttention-2 at D = 64 and 0.83× at D = 128.",
    "Against FA2: 0.8× at D = 64, causal or not.",          # one decimal: 0.79 rounds to 0.8
    "cuDNN is 1.75× faster at D = 128.",                      # the other way up: 1 / 0.57
    "Against cuDNN it reaches 0.57–0.58 (the best-peer column).",
])
def test_a_ratio_inside_its_range_passes(prose, rows):
    assert problems(RUNG02 + prose + "\n", rows) == []


@pytest.mark.parametrize("prose, claim", [
    ("Against FlashAttention-2 (`sdpa(flash)`) it reaches 0.79–0.90×.", "0.79–0.90×"),
    ("It reaches 0.83× FlashAttention-2 at D = 64.", "0.83×"),         # 0.83 is D = 128's
    ("Against FA2 it is 0.79× at D = 64, 0.75× causal.", "0.75×"),
    ("Against FlashAttention-2: 0.79 at D = 64 and (0.95×) below.", "0.95×"),
    ("Against cuDNN it reaches 0.50–0.58 overall.", "0.50–0.58"),
])
def test_a_ratio_outside_its_range_fails(prose, claim, rows):
    found = problems(RUNG02 + prose + "\n", rows)
    assert [p.claim for p in found] == [claim], found
    assert claim in prose_ratios.describe(found[0])


@pytest.mark.parametrize("prose", [
    "The sweep (`results/H200/fwd.csv`) agrees: median 0.95× FlashAttention-2.",   # another source
    "Rung 05 is 0.95× rung 02 there.",                                               # names another rung
    "The unfused path is 0.20× as fast.",
    "```\nflash_attn_mma 0.95× FlashAttention-2\n```",                              # code
    "| table | 0.95× FlashAttention-2 |",                                             # a hand-written table
    "## Heading 0.95× FA2",
    "It moves 2.5 KiB and 0.001–0.05 % of its wavefronts conflict; 12.50–13.75 ms; 0.25–0.50 registers.",
])
def test_what_is_not_a_checked_ratio_is_left_alone(prose, rows):
    assert problems(RUNG02 + prose + "\n", rows) == []


def test_the_generated_block_itself_is_not_prose(rows):
    text = RUNG02.replace("<!-- numbers:end -->", "against FlashAttention-2 9.99×\n<!-- numbers:end -->")
    assert problems(text, rows) == []


def test_a_backward_page_reads_the_backward_peers(rows):
    assert problems(RUNG13 + "It runs 1.10–1.16× FlashAttention-2's backward.\n", rows, "docs/13_bwd_mma.md") == []
    found = problems(RUNG13 + "It runs 2.0× FlashAttention-2's backward.\n", rows, "docs/13_bwd_mma.md")
    assert [p.claim for p in found] == ["2.0×"], found


def test_a_page_without_a_numbers_block_is_not_checked(rows):
    assert problems("# Ladder\n\nIt is 9.9× FlashAttention-2.\n", rows, "docs/ladder.md") == []


def run_regenerate(root, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "regenerate.py"), "--root", str(root),
                           "--gpu", "FakeGPU-A", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("prose")
    shutil.copytree(os.path.dirname(FIXTURE), root / "results")
    (root / "docs").mkdir()
    (root / "docs" / "02_split_q.md").write_text(RUNG02 + "Against FlashAttention-2 it reaches 0.79–0.83×.\n",
                                                 encoding="utf-8")
    result = run_regenerate(root)
    assert result.returncode == 0, result.stdout + result.stderr
    return root


def test_regenerate_check_fails_on_a_prose_ratio_outside_its_table(tree, tmp_path):
    assert run_regenerate(tree, "--check").returncode == 0
    bad = tmp_path / "bad"
    shutil.copytree(tree, bad)
    page = bad / "docs" / "02_split_q.md"
    page.write_text(page.read_text(encoding="utf-8").replace("0.79–0.83×", "0.79–0.95×"), encoding="utf-8")
    result = run_regenerate(bad, "--check")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "prose ratio outside its table: docs/02_split_q.md: '0.79–0.95×'" in result.stdout, result.stdout
    assert "would change" not in result.stdout, "the tables themselves are up to date"


def test_the_committed_pages_agree_with_their_tables():
    found = regenerate.prose_problems(ROOT, regenerate.DOCS_GPU, {})
    assert not found, "\n".join(prose_ratios.describe(p) for p in found)
