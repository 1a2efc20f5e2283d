"""scripts/ptxas_spills.py: the build's expected spill warnings counted in one line, any other shown in full,
the list recorded from a build's logs, and the table of docs/spills.md."""
import csv
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ptxas_spills.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ptxas_spills  # noqa: E402

ANON = "_ZN7attnlab50_GLOBAL__N__f9fadfa5_17_12_ws_pingpong_cu_1ee7b9819ws_kernelILi64EEEvv"
PLAIN = "_ZN7attnlab6bs_fwd22blocksparse_fwd_kernelILi128EEEvv"
SPILL = "ptxas warning : Registers are spilled to local memory in function '{}', {} bytes spill stores, {} bytes spill loads"
FRAME = "ptxas warning : Local memory used for function '{}', size of stack frame: {} bytes"


def test_anonymous_namespace_ids_are_dropped():
    assert ptxas_spills.normalize(ANON) == "_ZN7attnlab12_GLOBAL__N_19ws_kernelILi64EEEvv"
    assert ptxas_spills.normalize(PLAIN) == PLAIN


def test_warnings_are_parsed():
    assert ptxas_spills.parse_warning(SPILL.format(PLAIN, 4, 8)) == (PLAIN, "spill", "4 stores, 8 loads")
    assert ptxas_spills.parse_warning(FRAME.format(ANON, 48) + "\n") == (
        "_ZN7attnlab12_GLOBAL__N_19ws_kernelILi64EEEvv", "stack frame", "48")
    assert ptxas_spills.parse_warning("ptxas info    : Used 168 registers") is None


def source_tree(tmp_path, listed):
    """A source folder whose results/ptxas_spills.csv lists `listed` [(symbol, warning, bytes)]."""
    src = tmp_path / "src"
    (src / "results").mkdir(parents=True)
    (src / "kernels").mkdir()
    (src / "kernels" / "k.cu").write_text("", encoding="utf-8")
    with open(src / "results" / "ptxas_spills.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(ptxas_spills.COLUMNS)
        for symbol, warning, nbytes in listed:
            w.writerow(["kernels/k.cu", symbol, warning, nbytes, "k", "13.0"])
    return src


def fake_nvcc(tmp_path, rc=0):
    """A compiler that prints what ptxas would: two warnings, an info line; exits rc."""
    path = tmp_path / "fake_nvcc.py"
    path.write_text("import sys\n"
                    f"print({SPILL.format(PLAIN, 4, 8)!r}, file=sys.stderr)\n"
                    f"print({FRAME.format(ANON, 48)!r}, file=sys.stderr)\n"
                    "print('ptxas info    : Used 168 registers', file=sys.stderr)\n"
                    "print('compiled')\n"
                    f"sys.exit({rc})\n", encoding="utf-8")
    return [sys.executable, str(path)]


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_the_listed_warning_is_kept_out_and_the_other_shown(tmp_path):
    src = source_tree(tmp_path, [(PLAIN, "spill", "4 stores, 8 loads")])
    logs = tmp_path / "logs"
    cmd = fake_nvcc(tmp_path) + ["-c", str(src / "kernels" / "k.cu"), "-o", "CMakeFiles/k.cu.o"]
    result = run("filter", "--log-dir", str(logs), "--source-dir", str(src), "--", *cmd)
    assert result.returncode == 0 and result.stdout == "compiled\n", result
    assert "Registers are spilled" not in result.stderr, result.stderr
    assert FRAME.format(ANON, 48) + "\n  (a new spill: not in results/ptxas_spills.csv, recorded with CUDA 13.0)\n" \
        in result.stderr, result.stderr
    assert "ptxas info    : Used 168 registers\n" in result.stderr
    logged = (logs / "CMakeFiles_k.cu.o.txt").read_text(encoding="utf-8").splitlines()
    assert logged == [f"kernels/k.cu,{PLAIN},spill,\"4 stores, 8 loads\"",
                      "kernels/k.cu,_ZN7attnlab12_GLOBAL__N_19ws_kernelILi64EEEvv,stack frame,48"], logged

    summary = run("summary", "--log-dir", str(logs), "--source-dir", str(src))
    assert summary.returncode == 0
    assert summary.stdout == "attnlab: 1 expected ptxas spill warnings (docs/spills.md lists them); 1 new ones, " \
                             "printed above\n", summary.stdout


def test_a_failed_compile_keeps_its_exit_code_and_logs_nothing(tmp_path):
    src = source_tree(tmp_path, [])
    logs = tmp_path / "logs"
    cmd = fake_nvcc(tmp_path, rc=3) + ["-c", str(src / "kernels" / "k.cu"), "-o", "k.cu.o"]
    result = run("filter", "--log-dir", str(logs), "--source-dir", str(src), "--", *cmd)
    assert result.returncode == 3
    assert not logs.exists()


def test_record_then_every_warning_is_expected(tmp_path):
    src = source_tree(tmp_path, [])
    logs = tmp_path / "logs"
    cmd = fake_nvcc(tmp_path) + ["-c", str(src / "kernels" / "k.cu"), "-o", "k.cu.o"]
    assert run("filter", "--log-dir", str(logs), "--source-dir", str(src), "--", *cmd).returncode == 0
    assert run("record", "--log-dir", str(logs), "--source-dir", str(src)).returncode == 0
    rows = ptxas_spills.load(str(src / "results" / "ptxas_spills.csv"))
    assert [(r["symbol"], r["warning"]) for r in rows] == [
        ("_ZN7attnlab12_GLOBAL__N_19ws_kernelILi64EEEvv", "stack frame"), (PLAIN, "spill")]
    result = run("filter", "--log-dir", str(logs), "--source-dir", str(src), "--", *cmd)
    assert "ptxas warning" not in result.stderr, result.stderr
    summary = run("summary", "--log-dir", str(logs), "--source-dir", str(src))
    assert summary.stdout == "attnlab: 2 expected ptxas spill warnings (docs/spills.md lists them)\n"


def test_the_table_has_a_row_per_kernel():
    rows = [dict(source="kernels/blocksparse/instances/fwd_d128.cu", symbol="s", warning=w, bytes=b,
                 kernel="bs_fwd::k<1>", cuda="13.0") for w, b in (("spill", "120 stores, 68 loads"), ("stack frame", "120"))]
    block = ptxas_spills.table_block(rows, "")
    assert "2 warnings of a default build (sm_80 and sm_90a, CUDA 13.0)" in block
    assert "| [block-sparse forward](blocksparse.md) | `fwd_d128.cu` | `bs_fwd::k<1>` | 120 / 68 | 120 |" in block, block


def test_the_committed_list_names_real_sources_of_known_families():
    rows = ptxas_spills.load(os.path.join(ROOT, ptxas_spills.CSV))
    assert rows and len(rows) % 2 == 0, "a spill and its stack frame per kernel"
    for r in rows:
        assert os.path.isfile(os.path.join(ROOT, r["source"])), r["source"]
        assert any(r["source"].startswith(prefix) for prefix, _, _ in ptxas_spills.FAMILIES), r["source"]
