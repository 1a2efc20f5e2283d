"""python/backend/attnlab_backend.py: pip install refuses at once, in one line, when torch,
scikit-build-core or a build tool is missing, and names them in the order to install them."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKEND = os.path.join(ROOT, "python", "backend")
sys.path.insert(0, BACKEND)
import attnlab_backend  # noqa: E402


def finder(*present):
    return lambda module: module in present


def test_nothing_missing_nothing_said():
    assert attnlab_backend.refusal(True, finder("torch", "scikit_build_core"), lambda: True) == ""


def test_torch_and_scikit_build_core_missing_torch_first_in_one_line():
    line = attnlab_backend.refusal(True, finder(), lambda: True)
    assert "\n" not in line and line.startswith("attnlab: building needs torch and scikit-build-core, which ")
    assert line.index("install torch first") < line.index("pip install 'scikit-build-core>=0.11'"), line
    assert line.endswith("then rerun python3 -m pip install --no-build-isolation ."), line


def test_torch_alone_missing():
    line = attnlab_backend.refusal(True, finder("scikit_build_core"), lambda: True)
    assert line.startswith("attnlab: building needs torch, which ") and "scikit-build-core" not in line, line


def test_no_build_tool_named():
    line = attnlab_backend.refusal(True, finder("torch", "scikit_build_core"), lambda: False)
    assert line.startswith("attnlab: building needs ninja or make, which "), line
    assert "pip install ninja (or install make)" in line, line


def test_an_sdist_needs_scikit_build_core_alone():
    assert attnlab_backend.refusal(False, finder("scikit_build_core"), lambda: False) == ""
    line = attnlab_backend.refusal(False, finder("torch"), lambda: True)
    assert line.startswith("attnlab: building needs scikit-build-core, which "), line


def test_the_metadata_hook_exits_1_in_one_line_within_seconds(tmp_path):
    """The first hook pip calls, in a Python without site-packages (so without torch): exit 1, one line on stderr."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import attnlab_backend; "
            "attnlab_backend.prepare_metadata_for_build_wheel(sys.argv[2])")
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-S", "-c", code, BACKEND, str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert time.monotonic() - start < 10
    assert result.returncode == 1 and result.stdout == "", (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("attnlab: building needs torch"), result.stderr
    assert os.listdir(tmp_path) == []


def test_the_version_has_one_source():
    """pyproject.toml reads the version from attnlab.__version__ (scikit-build-core's regex provider)."""
    import re
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        pyproject = f.read()
    with open(os.path.join(ROOT, "python", "attnlab", "__init__.py"), encoding="utf-8") as f:
        init = f.read()
    assert 'dynamic = ["version"]' in pyproject and not re.search(r"^version\s*=", pyproject, re.M)
    assert 'provider = "scikit_build_core.metadata.regex"\ninput = "python/attnlab/__init__.py"' in pyproject
    assert re.search(r'^__version__ = "\d+\.\d+\.\d+"', init, re.M), "attnlab.__version__"
    assert 'license = "BSD-3-Clause"' in pyproject and os.path.isfile(os.path.join(ROOT, "LICENSE"))
