"""scripts/regenerate.py --check fails on a commit the results name but the history lacks.

In a git repository made here from the fixture CSVs: every commit real passes; a
row, or a commit cell of docs/experiments.md, naming an unknown commit fails
(exit 1, the file and the commit named on stderr) until results/gone_commits.csv
lists it, and then the captions print its note; without history nothing is checked.
"""
import csv
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "results")
GPU = "FakeGPU-A"
README = "# Fake\n\n<!-- results:begin -->\n<!-- results:end -->\n"
EXPERIMENTS = "# Experiments\n\n| what was tried | measured result | commit |\n|---|---|---|\n| a change | +1 % | {} |\n"

if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=attnlab", "-c", "user.email=attnlab@example.com",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


def regenerate(root, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "regenerate.py"), "--root", str(root),
                           "--gpu", GPU, *args], capture_output=True, text=True, timeout=600)


def set_commit(path, commit):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    for row in rows:
        row["commit"] = commit
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repository whose results name only its own first commit, regenerated and committed."""
    root = tmp_path_factory.mktemp("repo")
    git(root, "init", "-q")
    git(root, "commit", "-q", "--allow-empty", "-m", "first")
    head = git(root, "rev-parse", "--short=12", "HEAD")
    shutil.copytree(FIXTURES, root / "results")
    for folder, _, names in os.walk(root / "results"):
        for name in names:
            if name.endswith(".csv"):
                set_commit(os.path.join(folder, name), head)
    (root / "README.md").write_text(README, encoding="utf-8")
    (root / "docs").mkdir()
    (root / "docs" / "experiments.md").write_text(EXPERIMENTS.format(head[:7]), encoding="utf-8")
    result = regenerate(root)
    assert result.returncode == 0, result.stdout + result.stderr
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "results")
    return root, head


def copy_of(repo, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(repo, tree, symlinks=True)
    return tree


def test_real_commits_pass(repo):
    root, head = repo
    result = regenerate(root, "--check")
    assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
    assert "0 named commits not in the history" in result.stdout, result.stdout


def test_a_row_naming_an_unknown_commit_fails_until_listed(repo, tmp_path):
    tree = copy_of(repo[0], tmp_path)
    set_commit(tree / "results" / GPU / "fwd.csv", "deadbee")
    regenerate(tree)  # the captions name it now; only the commit check should fail
    result = regenerate(tree, "--check")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"results/{GPU}/fwd.csv names commit deadbee, which is not in the history: correct it, "
        "or list it in results/gone_commits.csv with what it measured"], result.stderr
    assert "would change" not in result.stdout and "1 named commits not in the history" in result.stdout

    (tree / "results" / "gone_commits.csv").write_text(
        f'commit,note\ndeadbee,"not in the history: a tree timed before {repo[1][:7]}"\n', encoding="utf-8")
    assert regenerate(tree).returncode == 0
    result = regenerate(tree, "--check")
    assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
    readme = (tree / "README.md").read_text(encoding="utf-8")
    assert f"deadbee (not in the history: a tree timed before {repo[1][:7]})" in readme, readme


def test_a_note_citing_an_unknown_commit_fails(repo, tmp_path):
    tree = copy_of(repo[0], tmp_path)
    (tree / "results" / "gone_commits.csv").write_text('commit,note\ndeadbee,"rows added by 1234abc"\n',
                                                      encoding="utf-8")
    result = regenerate(tree, "--check")
    assert result.returncode == 1 and "results/gone_commits.csv names commit 1234abc" in result.stderr, result.stderr


def test_an_experiments_row_naming_an_unknown_commit_fails(repo, tmp_path):
    tree = copy_of(repo[0], tmp_path)
    (tree / "docs" / "experiments.md").write_text(EXPERIMENTS.format(f"{repo[1][:7]}, abcdef0"), encoding="utf-8")
    result = regenerate(tree, "--check")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("docs/experiments.md names commit abcdef0,"), result.stderr


def test_without_history_nothing_is_checked(repo, tmp_path):
    tree = copy_of(repo[0], tmp_path)
    shutil.rmtree(tree / ".git")
    set_commit(tree / "results" / GPU / "fwd.csv", "deadbee")
    regenerate(tree)
    result = regenerate(tree, "--check")
    assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
    assert "commits not checked (no git history here)" in result.stdout
