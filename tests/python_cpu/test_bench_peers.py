"""scripts/bench_peers.py without a GPU: the harness's FLOP convention, the shapes
it takes in the harness's options, the rows it appends (results_csv's columns,
read back by results_csv), the verdict of its check, and its run without
flash-attn-4 (one line, exit 0); scripts/run_info.py's software line."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "bench_peers.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_peers as bp  # noqa: E402
import results_csv as rc  # noqa: E402
import run_info  # noqa: E402

FIELDS = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "runtime 13.0, driver API 13.0",
          "commit": "0123456789ab", "date": "2026-12-07T10:00:00Z"}
SOFTWARE = "torch 2.11.0+cu130, cuDNN 9.19.0, CUDA 13.0, driver 580.159.04, flash-attn-4 4.0.0b36, CUTLASS DSL 4.8.1"


@pytest.mark.parametrize("nq, nk", [(1, 1), (5, 5), (3, 7), (7, 3), (1000, 8192), (129, 77)])
@pytest.mark.parametrize("causal", [False, True])
def test_pairs_count_the_bottom_right_causal_mask_exactly(nq, nk, causal):
    brute = sum(1 for i in range(nq) for j in range(nk) if not causal or j <= i + nk - nq)
    assert bp.pairs(nq, nk, causal) == brute


def test_flops_reproduce_every_committed_row_of_the_harness():
    """Forward 2·B·H·(D+Dv)·pairs and backward 2·B·H·(3D+2Dv)·pairs: each committed harness row's TFLOPS from its
    time (causal, GQA, 192/128, Nq != Nk among them)."""
    checked = set()
    for name, flops in (("bench.csv", bp.forward_flops), ("bwd.csv", bp.backward_flops)):
        for r in rc.load([os.path.join(ROOT, "results", "H200", name)]):
            if r["tflops"] is None:
                continue
            shape = bp.Shape(B=r["B"], H=r["H"], Hkv=r["Hkv"], Nq=r["Nq"], Nk=r["Nk"], D=r["D"], Dv=r["Dv"],
                             dtype=r["dtype"], causal=bool(r["causal"]))
            assert bp.tflops(flops(shape), r["time_ms"]) == pytest.approx(r["tflops"], abs=0.006), (name, r)
            checked.add((name, r["causal"], r["Hkv"] != r["H"], r["D"] != r["Dv"], r["Nq"] != r["Nk"]))
    assert ("bench.csv", 1, True, False, False) in checked and ("bench.csv", 1, False, False, True) in checked
    assert ("bwd.csv", 1, False, True, False) in checked, checked


def test_shapes_are_the_harness_options():
    s = bp.parse_shape("--B 2 --H 32 --Hkv 8 --Nq 1000 --Nk 8192 --D 192 --Dv 128 --dtype bf16 --causal")
    assert (s.B, s.H, s.kv_heads, s.Nq, s.Nk, s.D, s.v_dim, s.dtype, s.causal, s.check) == \
        (2, 32, 8, 1000, 8192, 192, 128, "bf16", True, True)
    s = bp.parse_shape("--no-check --B 1 --H 48 --N 16384 --D 512")
    assert (s.Nq, s.Nk, s.kv_heads, s.v_dim, s.check, s.causal) == (16384, 16384, 48, 512, False, False)
    assert s.describe() == "B=1, H=48, N=16384, D=512, fp16"
    assert bp.parse_shape(bp.DEFAULT_SHAPE).describe() == "B=1, H=8, N=8192, D=128, fp16"


@pytest.mark.parametrize("text, says", [("--B x", "--B needs a positive integer"), ("--D 0", "positive integer"),
                                        ("--dtype fp32", "fp16 or bf16"), ("--H 8 --Hkv 3", "not a multiple"),
                                        ("--window 5", "unknown option"), ("--D", "needs a value"),
                                        ("--B '1", "shape")])
def test_bad_shapes_are_one_line(text, says):
    with pytest.raises(bp.BadInput) as e:
        bp.parse_shape(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_rows_are_the_harness_columns_and_read_back(tmp_path):
    gqa = bp.parse_shape("--B 1 --H 32 --Hkv 8 --N 8192 --D 128 --causal")
    dense = bp.parse_shape("--B 1 --H 8 --N 8192 --D 512")
    status, err, tol, text = bp.verdict([("O", 1.0e-4, 6.0e-4)], 2.0e-6)
    rows = [bp.csv_row(FIELDS, gqa, bp.FA4, 7, status, ms=2.0, flops=bp.forward_flops(gqa), err=err, tol=tol,
                       lse_err=2.0e-6, text=bp.note(gqa, text, SOFTWARE)),
            bp.csv_row(FIELDS, dense, bp.FA4, 8, "unsupported", text=bp.note(dense, "head_dim, 512: no", SOFTWARE))]
    assert all(tuple(r) == rc.COLUMNS for r in rows)
    path = tmp_path / "bench.csv"
    bp.append_rows(str(path), rows[:1])
    bp.append_rows(str(path), rows[1:])  # appended: one header
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == ",".join(rc.COLUMNS) and len(lines) == 3
    assert all(len(line.split(",")) == len(rc.COLUMNS) for line in lines), "a comma inside a field"
    first, second = rc.load([str(path)])
    assert (first["variant"], first["kind"], first["Hkv"], first["causal"]) == ("fa4", "peer", 8, 1)
    assert first["status"] == "PASS"
    assert first["tflops"] == pytest.approx(bp.tflops(bp.forward_flops(gqa), 2.0), abs=0.006)
    assert first["note"].startswith("Hkv=8; PASS err 1.00e-04 <= 6.00e-04; lse 2.00e-06; torch 2.11.0+cu130;")
    assert first["note"].endswith("flash-attn-4 4.0.0b36; CUTLASS DSL 4.8.1")
    assert first["cuda"] == "runtime 13.0; driver API 13.0" and first["ratio_to_best_peer"] == ""
    assert (second["status"], second["tflops"], second["time_ms"]) == ("unsupported", None, None)
    assert rc.best([first, second], rc.PEER) is first, "a peer row the tables' best peer reads"


def test_a_file_of_other_columns_is_refused(tmp_path):
    path = tmp_path / "blocksparse.csv"
    path.write_text(",".join(rc.COLUMNS + ("mask", "score")) + "\n", encoding="utf-8")
    assert "other columns" in bp.check_csv(str(path))
    assert bp.check_csv(str(tmp_path / "new.csv")) is None


def test_the_verdict_is_the_harness_rule():
    assert bp.verdict([("O", 1e-4, 6e-4)], 2e-6)[::3] == ("PASS", "PASS err 1.00e-04 <= 6.00e-04, lse 2.00e-06")
    assert bp.verdict([("O", 1e-4, 6e-4)], 2e-3)[::3] == ("FAIL",
                                                          "FAIL err 1.00e-04 <= 6.00e-04, lse 2.00e-03 > 1.00e-03")
    status, err, tol, text = bp.verdict([("dQ", 1e-4, 8e-4), ("dK", 5e-4, 6e-4), ("dV", 2e-4, 1e-3)])
    assert (status, err, tol) == ("PASS", 5e-4, 6e-4), "max_err and tol: the gradient nearest its bound"
    assert text == "PASS dQ 1.00e-04 <= 8.00e-04, dK 5.00e-04 <= 6.00e-04, dV 2.00e-04 <= 1.00e-03"
    status, err, tol, text = bp.verdict([("dQ", 1e-4, 8e-4), ("dK", float("nan"), 6e-4), ("dV", 2e-3, 1e-3)])
    assert status == "FAIL" and text.startswith("FAIL dQ 1.00e-04 <= 8.00e-04, dK nan > 6.00e-04, dV 2.00e-03 >")


def run_script(tmp_path, *args):
    """bench_peers.py in a fresh interpreter where flash_attn is a package without `cute`: flash-attn-4 absent,
    whatever this machine has installed."""
    (tmp_path / "flash_attn").mkdir(exist_ok=True)
    (tmp_path / "flash_attn" / "__init__.py").write_text("", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)


@pytest.mark.parametrize("args", [(), ("--bwd", "--shape", "--B 1 --H 8 --N 8192 --D 64 --causal")])
def test_without_flash_attn_4_one_line_and_exit_0(tmp_path, args):
    result = run_script(tmp_path, "--csv", str(tmp_path / "bench.csv"), *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "fa4: not installed (pip install attnlab[peers])\n" and result.stderr == ""
    assert not (tmp_path / "bench.csv").exists(), "no rows without the peer"


@pytest.mark.parametrize("args, says", [(("--shape", "--D x"), "--D needs a positive integer"),
                                        (("--iters", "0"), "--iters >= 1"), (("--nope",), "unrecognized")])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, says):
    result = run_script(tmp_path, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and says in result.stderr and result.stderr.startswith("bench_peers.py: ")


def test_the_software_line():
    assert run_info.cudnn_text(91900) == "9.19.0" and run_info.cudnn_text(8907) == "8.9.7"
    assert run_info.cudnn_text(None) == "absent"
    versions = run_info.software()
    assert list(versions) == ["torch", "cuDNN", "CUDA", "driver", "flash-attn-4", "CUTLASS DSL"]
    assert all(versions.values())
    assert run_info.software_line({"torch": "absent", "CUDA": "13.0"}) == "torch absent, CUDA 13.0"
    assert run_info.gpu_slug("NVIDIA H100 80GB HBM3") == "H100-80GB-HBM3" and run_info.gpu_slug("NVIDIA H200") == "H200"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "run_info.py")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("software: torch ") and result.stdout.count("\n") == 1


def test_peer_wheels_refuses_a_bad_command_in_one_line():
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "scripts", "peer_wheels.sh")
    for args in ([], ["fetch"], ["unpack", "/tmp/x"]):
        r = subprocess.run(["bash", script, *args], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "usage:" in r.stderr, (args, r)
