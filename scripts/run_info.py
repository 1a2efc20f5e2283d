#!/usr/bin/env python3
"""Where a Python benchmark's rows were measured, written as the harness writes it.

    python3 scripts/run_info.py      # prints the software line (no torch, GPU or package needed)

The Python benchmarks (bench_peers.py, bench_blocksparse.py) append rows to the
harness's results CSVs (results_csv.COLUMNS), so they fill the columns that say
where a row was measured as flash_attn_mma does (bench/system_info.cpp): `gpu`,
`driver`, `cuda` ("runtime 13.0; driver API 13.0"), `commit` (ATTNLAB_COMMIT, else
git's 12-digit short hash) and `date` (the UTC start of the run). Which peer ran
depends on more than that, so each script also prints, and writes into each
row's note, the software line: torch, cuDNN, CUDA, the driver, flash-attn-4 and
the CUTLASS DSL, each "absent" where it is not installed. Standard library only;
torch is read only when it is installed.
"""
import ctypes
import datetime
import importlib.metadata
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABSENT = "absent"
# (distribution, the name the software line gives it): the peers' packages beside torch
PACKAGES = (("flash-attn-4", "flash-attn-4"), ("nvidia-cutlass-dsl", "CUTLASS DSL"))


def csv_text(value):
    """A CSV field as the harness writes it (bench/runner.cpp csv_field): commas, quotes and newlines become ';'."""
    return re.sub(r'[,"\n]', ";", str(value))


def gpu_slug(name):
    """results/<gpu>/ as scripts/gpu_check.sh names it: "NVIDIA H200" -> "H200"."""
    name = re.sub(r"^NVIDIA ", "", name)
    name = re.sub(r"^GeForce ", "", name)
    return re.sub(r"-$", "", re.sub(r"[^A-Za-z0-9.]+", "-", name)) or "unknown-gpu"


def first_line(text, limit=160):
    """The first line of an error message, cut to `limit` characters (as the harness cuts torch's)."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def package_version(dist):
    """The installed version of distribution `dist`, or ABSENT."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ABSENT


def driver_version():
    """The NVIDIA driver's version (nvidia-smi), or ABSENT."""
    return (run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines() or [ABSENT])[0]


def driver_api_version():
    """The CUDA version the driver supports ('13.0', cuDriverGetVersion as the harness asks it), or ''."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return ""
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except (OSError, AttributeError):
        return ""


def cudnn_text(version):
    """torch.backends.cudnn.version() as 'major.minor.patch' (cuDNN 9 encodes 91900, cuDNN 8 8907)."""
    if not version:
        return ABSENT
    step = 10000 if version >= 90000 else 1000
    return f"{version // step}.{(version % step) // 100}.{version % 100}"


def software(torch=None):
    """{name: version} of the software line, in its order; torch: the module when the caller imported it."""
    if torch is None and "torch" in sys.modules:
        torch = sys.modules["torch"]
    versions = {"torch": torch.__version__ if torch is not None else package_version("torch")}
    cudnn = None
    if torch is not None:
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:  # cuDNN's own look at the GPUs may fail: the line says absent, the run goes on
            cudnn = None
    versions["cuDNN"] = cudnn_text(cudnn)
    versions["CUDA"] = (torch.version.cuda if torch is not None else None) or ABSENT
    versions["driver"] = driver_version()
    for dist, name in PACKAGES:
        versions[name] = package_version(dist)
    return versions


def software_line(versions):
    """'torch 2.11.0+cu130, cuDNN 9.19.0, CUDA 13.0, driver 580.159.04, flash-attn-4 absent, CUTLASS DSL absent'."""
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def system_fields(gpu, versions):
    """The columns gpu, driver, cuda, commit and date of a row measured now on `gpu`."""
    api = driver_api_version()
    cuda = versions["CUDA"]
    return {
        "gpu": gpu,
        "driver": "" if versions["driver"] == ABSENT else versions["driver"],
        "cuda": f"runtime {cuda}" + (f", driver API {api}" if api else ""),
        "commit": os.environ.get("ATTNLAB_COMMIT") or run(["git", "rev-parse", "--short=12", "HEAD"]) or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def main():
    try:
        import torch
    except ImportError:
        torch = None
    print("software: " + software_line(software(torch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
