"""The GPU tests of the Python module need torch with a CUDA GPU and an
importable attnlab (built: PYTHONPATH=build/python; installed: pip install).
Without them the whole run is skipped, before any test module is imported,
with one line saying why and exit code 77, which ctest counts as skipped
(SKIP_RETURN_CODE in CMakeLists.txt). An attnlab that is found but fails to
import is an error, not a skip.
"""
import importlib.util

import pytest

SKIPPED = 77


def _why_not_runnable():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        try:
            torch.cuda.init()
            reason = "torch sees no CUDA device"
        except Exception as error:  # torch's own words: no driver, no device, a CPU-only build
            reason = str(error).strip().splitlines()[0]
        return f"no usable CUDA GPU ({reason})"
    if importlib.util.find_spec("attnlab") is None:
        return "no attnlab module on the path (PYTHONPATH=build/python, or pip install --no-build-isolation .)"
    return None


def pytest_configure(config):
    reason = _why_not_runnable()
    if reason:
        pytest.exit(f"skipped: {reason}", returncode=SKIPPED)
