"""Generated means regenerated: scripts/regenerate.py on the committed tree and on the fixtures.

The committed README.md, docs/*.md and results/ must be exactly what
regenerate.py writes from the committed CSVs. Text files are compared byte for
byte. A PNG is compared byte for byte when the matplotlib here is the one that
drew the committed file (its Software text chunk says which); with another
version only its pixel size is compared and the byte comparison is skipped,
with the reason. Needs matplotlib: without it these tests fail, they do not skip.
"""
import os
import shutil
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "results")
COPIED = ("README.md", "docs", "results", "scripts", "kernels")  # kernels/: what docs/figures are drawn from
FIX_GPU = "FakeGPU-A"


def regenerate(script_root, root, *args):
    return subprocess.run([sys.executable, os.path.join(script_root, "scripts", "regenerate.py"), "--root", str(root),
                           *args], capture_output=True, text=True, timeout=600)


def expect_ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def files_under(root, ext):
    """Sorted '/'-separated paths, relative to root, of the files ending in `ext`."""
    found = []
    for folder, _, names in os.walk(root):
        found += [os.path.relpath(os.path.join(folder, n), root).replace(os.sep, "/") for n in names if n.endswith(ext)]
    return sorted(found)


def text_files(root):
    docs = [p for p in files_under(os.path.join(root, "docs"), ".md") if "/" not in p]
    readme = ["README.md"] if os.path.isfile(os.path.join(root, "README.md")) else []
    return readme + [f"docs/{p}" for p in docs] + [f"results/{p}" for p in files_under(os.path.join(root, "results"), ".md")]


def png_chunks(data):
    """[(type, payload)] of a PNG's chunks."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, i = [], 8
    while i < len(data):
        n, = struct.unpack(">I", data[i:i + 4])
        chunks.append((data[i + 4:i + 8], data[i + 8:i + 8 + n]))
        i += 12 + n
    return chunks


def png_software(data):
    texts = dict(p.split(b"\0", 1) for t, p in png_chunks(data) if t == b"tEXt")
    return texts.get(b"Software", b"").decode("latin-1")


def png_size(data):
    return struct.unpack(">II", png_chunks(data)[0][1][:8])


def matplotlib_here():
    import matplotlib  # no importorskip: the README's test command installs it
    return f"matplotlib {matplotlib.__version__}"


def read(root, rel):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


# ---- the committed tree ------------------------------------------------------------------


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """A copy of README.md, docs/, results/, scripts/ and kernels/, its PNGs deleted, then regenerated."""
    tree = tmp_path_factory.mktemp("tree")
    for name in COPIED:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif os.path.isfile(src):
            shutil.copy(src, tree / name)
    for folder in ("results", "docs"):
        for rel in files_under(tree / folder, ".png"):
            os.remove(tree / folder / rel)
    result = regenerate(tree, tree)
    expect_ok(result)
    return tree


def test_the_readme_and_the_ladder_page_hold_their_generated_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read().splitlines()
    with open(os.path.join(ROOT, "docs", "ladder.md"), encoding="utf-8") as f:
        ladder = f.read().splitlines()
    for marker in ("<!-- results:begin -->", "<!-- results:end -->", "<!-- ladder:begin -->", "<!-- ladder:end -->"):
        assert marker in readme, f"README.md has no line '{marker}'"
    for marker in ("<!-- ladder:begin -->", "<!-- ladder:end -->"):
        assert marker in ladder, f"docs/ladder.md has no line '{marker}'"


def test_regenerating_leaves_readme_docs_and_results_text_unchanged(regenerated):
    committed, redone = text_files(ROOT), text_files(regenerated)
    assert redone == committed, f"regenerate.py adds or removes text files: {sorted(set(redone) ^ set(committed))}"
    changed = [rel for rel in committed if read(ROOT, rel) != read(regenerated, rel)]
    assert not changed, f"not what scripts/regenerate.py writes (run it and commit the result): {changed}"


@pytest.mark.parametrize("folder", ["results", "docs"])
def test_regenerating_draws_the_committed_pngs(regenerated, folder):
    committed = files_under(os.path.join(ROOT, folder), ".png")
    redone = files_under(regenerated / folder, ".png")
    assert redone == committed, ("PNGs regenerate.py does not draw, or draws but are not committed: "
                                 f"{sorted(set(redone) ^ set(committed))}")
    here, other = matplotlib_here(), {}
    for rel in committed:
        old, new = read(ROOT, f"{folder}/{rel}"), read(regenerated, f"{folder}/{rel}")
        assert png_software(new) == here, f"{rel}: regenerated PNG says '{png_software(new)}'"
        drawn_by = png_software(old)
        if drawn_by == here:
            assert new == old, f"{folder}/{rel} is not what regenerate.py draws with {here}"
        else:
            assert png_size(new) == png_size(old), f"{folder}/{rel}: {png_size(new)} pixels, committed {png_size(old)}"
            other.setdefault(drawn_by or "no Software chunk", []).append(rel)
    if other:
        pytest.skip("pixel sizes equal; bytes not compared: " +
                    "; ".join(f"{len(v)} PNGs drawn by {k}, here {here}" for k, v in sorted(other.items())))


# ---- the fixtures ------------------------------------------------------------------------

README = """# Fake

<!-- ladder:begin -->
<!-- ladder:end -->

Some text that stays.

<!-- results:begin -->
stale
<!-- results:end -->
"""
PAGES = {
    "ladder.md": ("# Ladder\n\n<!-- ladder:begin -->\nstale\n<!-- ladder:end -->\n\n"
                  "<!-- ladder-bwd:begin -->\nstale\n<!-- ladder-bwd:end -->\n"),
    "13_bwd_mma.md": "# Rung 13\n\n<!-- numbers: bwd-mma -->\n<!-- numbers:end -->\n",
    "14_bwd_ws.md": "# Rung 14\n\n<!-- numbers: bwd-ws prev=bwd-mma -->\nstale\n<!-- numbers:end -->\n\nLimits.\n",
    "02_split_q.md": "# Rung 02\n\n<!-- numbers: split-q prev=split-kv -->\n<!-- numbers:end -->\n\nVerdict.\n",
    "dmattn_forward.md": "# Forward\n\n<!-- dmattn-table: train -->\n<!-- dmattn-table:end -->\n",
    "plain.md": "No generated block; the marker `<!-- results:begin -->` quoted in prose is text.\n",
}


def fixture_tree(root):
    shutil.copytree(FIXTURES, root / "results")
    (root / "docs").mkdir()
    (root / "README.md").write_text(README, encoding="utf-8")
    for name, text in PAGES.items():
        (root / "docs" / name).write_text(text, encoding="utf-8")
    return root


def snapshot(root):
    return {rel: read(root, rel) for rel in files_under(root, "")}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    tree = fixture_tree(tmp_path_factory.mktemp("fixtures"))
    expect_ok(regenerate(ROOT, tree, "--gpu", FIX_GPU))
    return tree


def test_fixture_regeneration_is_idempotent(fixtures):
    before = snapshot(fixtures)
    check = regenerate(ROOT, fixtures, "--gpu", FIX_GPU, "--check")
    expect_ok(check)
    assert "would change" not in check.stdout, check.stdout
    expect_ok(regenerate(ROOT, fixtures, "--gpu", FIX_GPU))
    after = snapshot(fixtures)
    assert after == before, f"a second run changed {[k for k in after if after[k] != before.get(k)]}"


def test_fixture_blocks_are_filled(fixtures):
    text = {rel: read(fixtures, rel).decode("utf-8") for rel in text_files(fixtures)}
    readme = text["README.md"]
    assert "Some text that stays." in readme and "stale" not in readme
    assert "| [02 `split-q`](docs/02_split_q.md) |" in readme and "| 310.2 (stage2) | – (01) | 0.83 | 0.57 |" in readme
    assert "| 00 `minimal` |" in readme, "a rung without a page must still have its row, unlinked"
    assert "`results/FakeGPU-A/fwd.csv`" in readme and "(results/FakeGPU-A/fwd_tflops_vs_N.png)" in readme
    assert "| [02 `split-q`](02_split_q.md) |" in text["docs/ladder.md"]
    assert "bwd-" not in readme, "the forward ladder shows backward rungs"
    ladder, bwd = text["docs/ladder.md"].split("<!-- ladder-bwd:begin -->")
    assert "bwd-" not in ladder and "stale" not in bwd, bwd
    assert "| [13 `bwd-mma`](13_bwd_mma.md) | FlashAttention-2's backward" in bwd, bwd
    assert "| 330.0 | – (02: forward) | 1.10 | 0.79 |" in bwd, "rung 13's row: 330 over 300 (FA2) and 420 (cuDNN)"
    assert "| [14 `bwd-ws`](14_bwd_ws.md) |" in bwd and "| 450.0 | 1.36 (13) | 1.50 | 1.07 |" in bwd, bwd
    assert "| 1,8,8192,8192,128 | fp16 | no | 330.0 | 300.0 | 420.0 sdpa(cudnn) bwd |" in text["docs/13_bwd_mma.md"]
    rung14 = text["docs/14_bwd_ws.md"]
    assert "| 1,8,8192,8192,128 | fp16 | no | 450.0 | 430.0 | 330.0 (bwd-mma) |" in rung14, rung14
    assert "stale" not in rung14 and rung14.endswith("<!-- numbers:end -->\n\nLimits.\n"), rung14
    assert "| 1,8,8192,8192,64 | fp16 | no |" in text["docs/02_split_q.md"]
    assert text["docs/02_split_q.md"].endswith("<!-- numbers:end -->\n\nVerdict.\n")
    assert "| 32768 | 0.20% | 99.8% | 0.5781 |" in text["docs/dmattn_forward.md"]
    assert text["docs/plain.md"] == PAGES["plain.md"]
    for rel, body in text.items():
        assert str(fixtures) not in body and ROOT not in body, f"{rel} holds an absolute path"


def test_fixture_ladder_blocks_show_the_main_path_bars(fixtures):
    readme = read(fixtures, "README.md").decode("utf-8")
    ladder_block = readme[readme.index("<!-- ladder:begin -->"):readme.index("<!-- ladder:end -->")]
    assert "](results/FakeGPU-A/fwd_main_path.png)" in ladder_block, ladder_block
    page = read(fixtures, "docs/ladder.md").decode("utf-8")
    forward, backward = page.split("<!-- ladder-bwd:begin -->")
    assert "](../results/FakeGPU-A/fwd_main_path.png)" in forward and "fwd_main_path" not in backward, page
    assert os.path.isfile(fixtures / "results" / "FakeGPU-A" / "fwd_main_path.png")


def test_fixture_pngs_record_the_matplotlib_version_and_no_time(fixtures):
    pngs = files_under(fixtures / "results", ".png")
    assert "FakeGPU-A/fwd_tflops_vs_N.png" in pngs and "compare_gpus.png" in pngs, pngs
    for rel in pngs:
        data = read(fixtures, f"results/{rel}")
        assert png_software(data) == matplotlib_here(), rel
        assert not any(t == b"tIME" for t, _ in png_chunks(data)), f"{rel} has a time stamp"


def test_check_lists_what_would_change_and_writes_nothing(fixtures, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(fixtures, tree)
    (tree / "README.md").write_text(read(tree, "README.md").decode("utf-8").replace("310.2", "999.9"), encoding="utf-8")
    os.remove(tree / "results" / "FakeGPU-A" / "fwd_ratio_heatmap.png")
    before = snapshot(tree)
    result = regenerate(ROOT, tree, "--gpu", FIX_GPU, "--check")
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert "would change: README.md" in result.stdout, result.stdout
    assert "would change: results/FakeGPU-A/fwd_ratio_heatmap.png" in result.stdout, result.stdout
    assert snapshot(tree) == before, "--check wrote files"


def test_malformed_markers_exit_2(fixtures, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(fixtures, tree)
    (tree / "docs" / "broken.md").write_text("<!-- ladder:begin -->\nno end\n", encoding="utf-8")
    result = regenerate(ROOT, tree, "--gpu", FIX_GPU)
    assert result.returncode == 2 and "docs/broken.md" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
