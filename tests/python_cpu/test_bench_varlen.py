"""scripts/bench_varlen.py without a GPU (and without torch): the lengths it
draws, the exact pair counts, the FLOP and byte formulas, the paged cache's
tables, the CSV rows it appends, its options, and its refusal to run without
--unverified (one line, exit 2)."""
import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "bench_varlen.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_peers as bp  # noqa: E402
import bench_varlen as bv  # noqa: E402

FIELDS = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "runtime 13.0, driver API 13.0",
          "commit": "0123456789ab", "date": "2026-12-07T10:00:00Z"}
SOFTWARE = "torch 2.11.0+cu130, cuDNN 9.19.0, CUDA 13.0, flash-attn-4 absent, FlashInfer 0.5.2"


# ---- the lengths -------------------------------------------------------------------------------

def test_lengths_are_the_seeds_and_sum_to_the_total_within_their_bounds():
    first = bv.draw_lengths(0, 65536, 2048, 1, 16384)
    assert first == bv.draw_lengths(0, 65536, 2048, 1, 16384), "the same seed, the same lengths"
    assert first != bv.draw_lengths(1, 65536, 2048, 1, 16384)
    assert sum(first) == 65536 and all(1 <= n <= 16384 for n in first)
    for seed, total, mean, low, high in ((3, 1000, 10, 5, 20), (4, 7, 3, 1, 4), (5, 12345, 600, 100, 4000)):
        lengths = bv.draw_lengths(seed, total, mean, low, high)
        assert sum(lengths) == total
        assert all(low <= n <= high for n in lengths[:-1]), "only the last, cut to the total, may fall below"
        assert 1 <= lengths[-1] <= high


def test_the_lengths_mean_is_the_one_asked():
    """The distribution's own mean is --mean exactly; many draws come near it."""
    for low, high, mean in ((1, 16384, 2048), (1, 16384, 9000), (100, 4000, 150), (1, 2, 1.5)):
        assert bv.distribution_mean(low, bv.length_weights(low, high, mean)) == pytest.approx(mean, abs=1e-6)
    many = bv.draw_lengths(7, 1 << 24, 2048, 1, 16384)
    assert sum(many) / len(many) == pytest.approx(2048, rel=0.05)
    assert bv.draw_lengths(0, 50, 5, 5, 5) == [5] * 10, "one length allowed: every draw is it"


@pytest.mark.parametrize("low, high, mean, says", [(0, 10, 5, "1 <= --min-len"), (10, 5, 7, "1 <= --min-len"),
                                                   (1, 100, 200, "--mean must lie within"),
                                                   (10, 100, 5, "--mean must lie within")])
def test_bad_length_bounds_are_one_line(low, high, mean, says):
    with pytest.raises(bv.BadInput) as e:
        bv.draw_lengths(0, 100, mean, low, high)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_sizes_and_lists():
    assert [bv.parse_size(t, "x") for t in ("64K", "2k", "1M", "517")] == [65536, 2048, 1 << 20, 517]
    assert bv.parse_list("64,256", "x") == [64, 256]
    assert bv.parse_cache_cases("4K,1000/9000") == [(4096,), (1000, 9000)]
    assert bv.cache_lengths((1000, 9000), 5) == (1000, 9000, 1000, 9000, 1000)
    for bad in ("", "x", "-1", "1.5K", "0"):
        with pytest.raises(bv.BadInput):
            bv.parse_size(bad, "--total")
    assert bv.parse_size("0", "--Hkv", 0) == 0


# ---- pairs, FLOPs and bytes --------------------------------------------------------------------

@pytest.mark.parametrize("nq, nk", [(0, 5), (5, 0), (1, 1), (5, 5), (3, 7), (7, 3), (1, 4096), (4, 4096), (129, 77)])
@pytest.mark.parametrize("causal", [False, True])
def test_pairs_count_the_bottom_right_causal_mask_exactly(nq, nk, causal):
    brute = sum(1 for i in range(nq) for j in range(nk) if not causal or j <= i + nk - nq)
    assert bv.pairs(nq, nk, causal) == brute == bp.pairs(nq, nk, causal)


def test_a_batchs_pairs_are_its_sequences():
    lengths = (17, 1, 300, 64)
    varlen = bv.Case(bv.VARLEN, lengths, 16, 16, 128, 128, causal=True)
    assert varlen.pairs == sum(n * (n + 1) // 2 for n in lengths)
    assert bv.Case(bv.VARLEN, lengths, 16, 16, 128, 128, causal=False).pairs == sum(n * n for n in lengths)
    decode = bv.Case(bv.DECODE, (4096, 100), 32, 8, 128, 128, causal=True, Nq=4, page_sizes=(64,))
    brute = sum(1 for L in (4096, 100) for t in range(4) for j in range(L) if j <= L - 4 + t)
    assert decode.pairs == brute == (4 * 4096 - 6) + (4 * 100 - 6)


def test_flops_are_the_harness_convention():
    """Forward 2·H·(D+Dv)·pairs, backward 2·H·(3D+2Dv)·pairs: a batch of one sequence counts as the harness counts
    the dense problem (bench_peers.py reproduces its committed rows)."""
    for n, causal, D, Dv in ((8192, True, 128, 128), (1000, False, 192, 128), (77, True, 64, 64)):
        case = bv.Case(bv.VARLEN, (n,), 16, 16, D, Dv, causal=causal)
        dense = bp.Shape(B=1, H=16, Nq=n, Nk=n, D=D, Dv=Dv, causal=causal)
        assert case.flops(bv.FWD) == bp.forward_flops(dense) == 2 * 16 * (D + Dv) * case.pairs
        assert case.flops(bv.BWD) == bp.backward_flops(dense) == 2 * 16 * (3 * D + 2 * Dv) * case.pairs
    two = bv.Case(bv.VARLEN, (3000, 5000), 8, 8, 128, 128, causal=True)
    assert two.flops(bv.FWD) == sum(bp.forward_flops(bp.Shape(B=1, H=8, Nq=n, Nk=n, D=128, causal=True))
                                    for n in (3000, 5000))
    assert bv.tflops(2e12, 1000.0) == pytest.approx(2.0)


def test_decode_bytes_are_k_and_v_once_plus_q_and_o():
    case = bv.Case(bv.DECODE, (4096,) * 64, 32, 8, 128, 128, causal=True, Nq=1, page_sizes=(64, 256))
    assert case.kv_bytes == 64 * 4096 * 8 * (128 + 128) * 2 == 1 << 30
    assert case.qo_bytes == 64 * 1 * 32 * (128 + 128) * 2
    assert case.bytes == case.kv_bytes + case.qo_bytes
    assert bv.gbps(case.bytes, 1.0) == pytest.approx(case.bytes / 1e6)
    ragged = bv.Case(bv.DECODE, (1000, 9000), 32, 8, 128, 64, causal=True, Nq=4, page_sizes=(256,))
    assert ragged.kv_bytes == 10000 * 8 * 192 * 2 and ragged.qo_bytes == 2 * 4 * 32 * 192 * 2
    paged, contiguous = bv.decode_memory(ragged)
    assert paged == (4 + 36) * 256 * 8 * 192 * 2 and contiguous == 2 * 9000 * 8 * 192 * 2


# ---- the paged cache's tables ------------------------------------------------------------------

def test_the_block_table_reads_every_page_once_in_a_seeded_order():
    lengths = (1, 256, 257, 1000, 9000)
    table, pages = bv.block_table(lengths, 256, seed=3)
    counts = [bv.pages_for(n, 256) for n in lengths]
    assert pages == sum(counts) and len(table) == len(lengths) and {len(row) for row in table} == {max(counts)}
    used = [p for row, c in zip(table, counts) for p in row[:c]]
    assert sorted(used) == list(range(pages)), "a permutation of the cache's pages"
    assert used != list(range(pages)), "scattered, not in order"
    assert (table, pages) == bv.block_table(lengths, 256, seed=3) != bv.block_table(lengths, 256, seed=4)


def test_smaller_pages_view_the_same_memory():
    """Key j of sequence b lies at the same row of the cache's memory through either table."""
    lengths = (1, 255, 256, 700, 1025)
    big, small = 256, 64
    table, _ = bv.block_table(lengths, big, seed=0)
    split = bv.split_table(table, lengths, big, small)
    for b, n in enumerate(lengths):
        assert len(split[b]) == max(bv.pages_for(m, small) for m in lengths)
        for j in range(n):
            assert table[b][j // big] * big + j % big == split[b][j // small] * small + j % small
    with pytest.raises(bv.BadInput):
        bv.split_table(table, lengths, 256, 96)


def test_flashinfer_page_lists():
    lengths = (1, 64, 65, 200)
    table, _ = bv.block_table(lengths, 64, seed=1)
    indptr, indices, last = bv.csr_pages(table, lengths, 64)
    assert indptr == [0, 1, 2, 4, 8] and last == [1, 64, 1, 8]
    assert indices == [p for row, c in zip(table, (1, 1, 2, 4)) for p in row[:c]]


# ---- rows and the CSV --------------------------------------------------------------------------

def rows_of_a_case():
    varlen = bv.Case(bv.VARLEN, (100, 3, 2000), 16, 16, 128, 128, causal=True)
    decode = bv.Case(bv.DECODE, (4096,) * 4, 32, 8, 128, 128, causal=True, Nq=4, page_sizes=(64, 256))
    ours = bv.Entry(bv.OURS_VARLEN, bv.OURS, status="PASS", unverified=True, err=1e-3, tol=4e-3, ms=2.0,
                    text="PASS O 1.00e-03 <= 4.00e-03 (#2), lse 1.00e-06; worst of 3 sequences")
    refused = bv.Entry(bv.FA4_VARLEN + " bwd", bv.PEER, status="unsupported",
                       text="varlen backward is not yet supported on sm90, so says, the peer")
    paged = bv.Entry(bv.OURS_DECODE, bv.OURS, status="PASS", page_size=64, unverified=True, nbytes=decode.bytes,
                     ms=0.5, err=2e-4, tol=1e-3)
    copy = bv.Entry(bv.COPY, bv.YARDSTICK, nbytes=2 << 30, ms=1.25, note="1024 MiB read and written")
    rate = bv.gbps(copy.nbytes, copy.ms)
    return [bv.csv_row(FIELDS, varlen, bv.FWD, ours, 0, SOFTWARE),
            bv.csv_row(FIELDS, varlen, bv.BWD, refused, 0, SOFTWARE),
            bv.csv_row(FIELDS, decode, bv.FWD, paged, 5, SOFTWARE, rate),
            bv.csv_row(FIELDS, decode, bv.FWD, copy, 5, SOFTWARE, rate)], varlen, decode


def test_rows_are_the_columns_and_read_back(tmp_path):
    rows, varlen, decode = rows_of_a_case()
    assert all(tuple(r) == bv.COLUMNS for r in rows)
    path = tmp_path / "varlen.csv"
    bv.append_rows(str(path), rows[:2])
    bv.append_rows(str(path), rows[2:])  # appended: one header
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == ",".join(bv.COLUMNS) and len(lines) == 5
    assert all(len(line.split(",")) == len(bv.COLUMNS) for line in lines), "a comma inside a field"
    with open(path, newline="", encoding="utf-8") as f:
        ours, refused, paged, copy = list(csv.DictReader(f))
    assert (ours["part"], ours["row"], ours["kind"], ours["direction"], ours["unverified"]) == \
        ("varlen", "attnlab varlen", "ours", "fwd", "1")
    assert (ours["B"], ours["Nq"], ours["Nk"], ours["lengths"], ours["total"], ours["page_size"]) == \
        ("3", "2000", "2000", "100/3/2000", "2103", "")
    assert int(ours["pairs"]) == varlen.pairs and ours["bytes"] == "" and ours["gbps"] == ""
    assert float(ours["tflops"]) == pytest.approx(bv.tflops(varlen.flops(bv.FWD), 2.0), abs=0.006)
    assert (ours["err"], ours["tol"], ours["pass"]) == ("1.000e-03", "4.000e-03", "PASS")
    assert ours["note"].startswith("PASS O 1.00e-03 <= 4.00e-03 (#2); lse 1.00e-06; worst of 3 sequences; torch ")
    assert ours["cuda"] == "runtime 13.0; driver API 13.0"
    assert (refused["row"], refused["direction"], refused["pass"], refused["time_ms"], refused["tflops"]) == \
        ("fa4 varlen bwd", "bwd", "unsupported", "", "")
    assert refused["unverified"] == "0" and "so says; the peer" in refused["note"]
    assert (paged["Nq"], paged["Nk"], paged["lengths"], paged["total"], paged["page_size"], paged["seed"]) == \
        ("4", "4096", "4096", "16384", "64", "5")
    assert int(paged["bytes"]) == decode.bytes
    assert float(paged["gbps"]) == pytest.approx(bv.gbps(decode.bytes, 0.5), abs=0.06)
    fraction = bv.gbps(decode.bytes, 0.5) / bv.gbps(2 << 30, 1.25)
    assert float(paged["copy_fraction"]) == pytest.approx(fraction, abs=0.001)
    assert (copy["kind"], copy["tflops"], copy["copy_fraction"]) == ("yardstick", "", "1.000")
    assert copy["pass"] == "unchecked"
    assert float(copy["gbps"]) == pytest.approx((2 << 30) / 1.25e-3 / 1e9, abs=0.06)


def test_the_table_lines():
    _, varlen, decode = rows_of_a_case()
    ours = bv.Entry(bv.OURS_DECODE, bv.OURS, status="PASS", text="PASS O 1e-3", page_size=64, unverified=True,
                    nbytes=decode.bytes, ms=0.5)
    line = bv.table_line(ours, decode, bv.FWD, copy_rate=2 * bv.gbps(decode.bytes, 0.5))
    assert "attnlab decode (pages of 64)" in line and "ours, unverified" in line and "50.0% of copy" in line
    refused = bv.Entry(bv.FA4_PAGED, bv.PEER, status="unsupported", text="paged KV not supported on SM 9.0")
    assert bv.table_line(refused, decode, bv.FWD).endswith("unsupported: paged KV not supported on SM 9.0")


def test_a_file_of_other_columns_is_refused(tmp_path):
    path = tmp_path / "bench.csv"
    path.write_text("gpu,driver,cuda,commit,date,variant\n", encoding="utf-8")
    assert "other columns" in bv.check_csv(str(path))
    assert bv.check_csv(str(tmp_path / "new.csv")) is None


# ---- options and the refusal -------------------------------------------------------------------

def test_the_default_set_and_quick():
    args = bv.parse_args(["--unverified"])
    parts = [(c.part, c.causal, c.Nq, c.longest if c.part == bv.DECODE else None) for c in args.cases]
    assert parts[:3] == [("varlen", True, 0, None), ("decode", True, 1, 4096), ("varlen", False, 0, None)], \
        "varlen and decode cases in turn"
    decode = [c for c in args.cases if c.part == bv.DECODE]
    assert [(c.longest, c.Nq) for c in decode] == [(L, nq) for L in (4096, 16384, 65536, 131072) for nq in (1, 4)]
    assert all((c.B, c.H, c.Hkv, c.D, c.page_sizes, c.dtype) == (64, 32, 8, 128, (64, 256), "bf16") for c in decode)
    varlen = [c for c in args.cases if c.part == bv.VARLEN]
    assert all((c.total, c.H, c.Hkv, c.D, c.Dv) == (65536, 16, 16, 128, 128) for c in varlen)
    assert (args.warmup, args.iters) == (3, 20)
    quick = bv.parse_args(["--unverified", "--quick", "--iters", "7"])
    assert (quick.warmup, quick.iters) == (1, 7), "an option given wins over --quick's"
    assert sum(c.part == bv.DECODE for c in quick.cases) == 4
    given = bv.parse_args(["--unverified", "--parts", "varlen", "--lengths", "8192,1,0,517", "--varlen-causal", "no"])
    assert [(c.lengths, c.causal) for c in given.cases] == [((8192, 1, 0, 517), False)]


@pytest.mark.parametrize("options, says", [(["--parts", "prefill"], "--parts"),
                                           (["--page-sizes", "64,96"], "does not divide"),
                                           (["--cache-lens", "2", "--decode-nq", "4"], "at least 4 keys"),
                                           (["--H", "16", "--Hkv", "3"], "not a multiple"),
                                           (["--iters", "0"], "--iters >= 1")])
def test_bad_options_are_one_line(options, says):
    with pytest.raises(bv.BadInput) as e:
        bv.parse_args(["--unverified"] + options)
    assert says in str(e.value) and "\n" not in str(e.value)


def run_script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_without_unverified_one_line_and_exit_2():
    result = run_script("--quick")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("bench_varlen.py: ")
    assert "--unverified" in result.stderr and "not run on a GPU" in result.stderr


@pytest.mark.parametrize("args, says", [(("--unverified", "--mean", "20K"), "--mean must lie within"),
                                        (("--unverified", "--nope"), "unrecognized")])
def test_bad_options_exit_2_in_one_line(args, says):
    result = run_script(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and says in result.stderr and result.stderr.startswith("bench_varlen.py: ")


def test_without_a_gpu_it_says_so_and_exits_3():
    """Here there is no GPU (and perhaps no torch): one line, exit 3, nothing written."""
    result = run_script("--unverified", "--quick", "--no-csv")
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("bench_varlen.py: ")
