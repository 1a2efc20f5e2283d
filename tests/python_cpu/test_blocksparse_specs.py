"""The block-sparse specs in Python (python/attnlab/mods.py), without torch or
the extension: the mask_mod / score_mod grammar and its one-line errors, the
Python mask_mods and score_mods on plain ints (the same callables torch's
create_block_mask and flex_attention take), the benchmark's document ids, its
CSV columns and its dmattn cases (scripts/bench_blocksparse.py); and mods.py's
rows against the kernels' table, kernels/blocksparse/mods_table.h, parsed
here. The GPU tests (tests/python/test_blocksparse.py) check the grammar
against the C++ parser.
"""
import importlib.util
import math
import os
import random
import re
import sys

import numpy
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mods = _load("attnlab_mods", "python/attnlab/mods.py")


@pytest.mark.parametrize("spec, parsed", [
    ("none", ("none", ())), ("causal", ("causal", ())), ("sliding_window:128,0", ("sliding_window", (128, 0))),
    ("block_diagonal:100", ("block_diagonal", (100,))), ("mini_causal:64", ("mini_causal", (64,))),
    ("prefix_lm:0", ("prefix_lm", (0,))), ("dilated_sliding_window:256,2", ("dilated_sliding_window", (256, 2))),
    ("document", ("document", ())),
])
def test_mask_specs(spec, parsed):
    assert mods.parse_mask_spec(spec) == parsed
    assert mods.canonical_mask_spec(spec) == spec


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown mask_mod 'nope'"), ("causal:1", "unknown mask_mod 'causal:1'"),
    ("document:3", "unknown mask_mod"), ("sliding_window", "takes LEFT,RIGHT, got ''"),
    ("sliding_window:1", "takes LEFT,RIGHT, got '1'"), ("sliding_window:1,-2", "takes LEFT,RIGHT"),
    ("block_diagonal:0", "needs a block >= 1"), ("mini_causal:x", "takes B"),
    ("dilated_sliding_window:8,0", "needs a stride >= 1"), ("prefix_lm:1,2", "takes P"),
])
def test_bad_mask_specs_are_one_line(spec, message):
    with pytest.raises(ValueError) as e:
        mods.parse_mask_spec(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_score_specs():
    assert mods.parse_score_spec(None) == ("none", ())
    assert mods.parse_score_spec("alibi") == ("alibi", ())
    assert mods.parse_score_spec("softcap:30") == ("softcap", (30.0,))
    for bad in ["softcap", "softcap:0", "softcap:-3", "softcap:inf", "softcap:nan", "alibi:2", "tanh"]:
        with pytest.raises(ValueError) as e:
            mods.parse_score_spec(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError):
        mods.parse_score_spec(3)


def _table_rows(macro):
    """The rows of X-macro `macro` in kernels/blocksparse/mods_table.h, each a
    list of its columns: string literals unquoted, numbers as ints, names as
    they are."""
    text = open(os.path.join(ROOT, "kernels", "blocksparse", "mods_table.h"), encoding="utf-8").read()
    body = re.search(rf"#define {macro}\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    assert body, f"no #define {macro}(X) in mods_table.h"
    rows = []
    for row in re.findall(r"\bX\(((?:\"[^\"]*\"|[^()\"])*)\)", body[1]):
        cells = re.findall(r'\s*("[^"]*"|[^,]+?)\s*(?:,|$)', row)
        rows.append([c[1:-1] if c.startswith('"') else int(c) if c.isdigit() else c for c in cells])
    return rows


def _mod_list(rows):
    return ", ".join(r[0] + (":" + r[1] if r[1] else "") for r in rows)


def test_the_mask_mods_are_the_kernels():
    """mods.py's mask_mod rows are mods_table.h's: the same names in the same
    order, argument names, forms, least values, messages and tensor flags; so
    its grammar, lists and messages are the C++ parser's."""
    table = _table_rows("ATTNLAB_MASK_MODS")
    assert [r[0] for r in table][:3] == ["kNone", "kCausal", "kSlidingWindow"] and all(len(r) == 8 for r in table)
    ours = [[r.name, r.args, r.form, *(tuple(r.least) + (0, 0))[:2], r.need, int(r.tensor)] for r in mods.MASK_ROWS]
    assert ours == [r[1:] for r in table]
    for r in mods.MASK_ROWS:
        assert len(r.least) == (len(r.args.split(",")) if r.args else 0)
        assert len(r.draws) == len(r.least) and all(len(e) == len(r.least) for e in r.examples)
        assert all(min(d) >= least for d, least in zip(r.draws, r.least))
    assert mods._MASK_LIST == _mod_list(r[1:] for r in table if not r[7])  # mask_mod_names(false)
    assert set(mods.MASK_MODS) == {r[1] for r in table if not r[7]}


def test_the_score_mods_are_the_kernels():
    """The same of the score_mods: names, order, arguments, forms, tensor flags."""
    table = _table_rows("ATTNLAB_SCORE_MODS")
    assert [r[0] for r in table][:2] == ["kNone", "kRelBias"] and all(len(r) == 6 for r in table)
    assert [[r.name, r.args, r.form, int(r.tensor)] for r in mods.SCORE_ROWS] == [[r[1], r[2], r[3], r[5]] for r in table]
    for r in mods.SCORE_ROWS:
        assert len(r.draws) == (1 if r.args else 0) and all(min(d) > 0 for d in r.draws)
    assert mods._SCORE_LIST == _mod_list(r[1:] for r in table if not r[5])
    assert set(mods.SCORE_MODS) == {r[1] for r in table if not r[5]}


def test_the_docstring_lists_every_mod():
    doc = " ".join(mods.__doc__.split())
    assert f"mask_mods {mods._MASK_LIST} score_mods {mods._SCORE_LIST} " in doc


def test_every_mod_has_examples_and_draws():
    """The curated and random specs of the tests and scripts/fuzz_blocksparse.py
    (tests/python/flex_reference.py) come from the rows: every mod but the
    tensor ones has an example and a draw, each a spec the grammar takes."""
    for rows, parse in ((mods.MASK_ROWS, mods.parse_mask_spec), (mods.SCORE_ROWS, mods.parse_score_spec)):
        examples = mods.example_specs(rows)
        assert {parse(spec)[0] for spec in examples} == {r.name for r in rows if not r.tensor}
        draws = mods.spec_draws(rows)
        assert len(draws) == sum(not r.tensor for r in rows)
        rng = random.Random(0)
        for draw in draws * 20:
            parse(draw(rng))


def test_every_mod_has_a_callable():
    """torch_mask_mod and torch_score_mod, the GPU tests' reference, know every mod of the rows."""
    doc_ids = numpy.array([[0, 0, 1, 1]])
    for spec in mods.example_specs(mods.MASK_ROWS):
        keep = mods.torch_mask_mod(spec, 4, 4, doc_ids)
        assert all(keep(0, 0, q, k) in (True, False) for q in range(4) for k in range(4))
    for spec in mods.example_specs(mods.SCORE_ROWS):
        f = mods.torch_score_mod(spec, 8)
        assert (f is None) == (spec == "none") and (f is None or math.isfinite(f(1.0, 0, 0, 3, 1)))


def test_the_benchmark_cases_are_specs():
    """scripts/bench_blocksparse.py's default cases name mods that mods.py parses."""
    bench = _load("bench_blocksparse", "scripts/bench_blocksparse.py")
    for text in bench.DEFAULT_CASES:
        if text.startswith(bench.DMATTN_TOPK):
            continue
        mask, score, _ = bench.parse_case(text)
        mods.parse_mask_spec(mask)
        mods.parse_score_spec(score)


def test_mask_mods_on_ints():
    def kept(spec, Nq, Nk, doc_ids=None):
        f = mods.torch_mask_mod(spec, Nq, Nk, doc_ids)
        return {(q, k) for q in range(Nq) for k in range(Nk) if f(0, 0, q, k)}

    # causal and sliding_window: bottom-right aligned (offset Nk - Nq)
    assert kept("causal", 2, 4) == {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)}
    assert kept("causal", 4, 2) == {(2, 0), (3, 0), (3, 1)}
    assert kept("sliding_window:1,0", 3, 3) == {(0, 0), (1, 0), (1, 1), (2, 1), (2, 2)}
    assert kept("none", 2, 3) == {(q, k) for q in range(2) for k in range(3)}
    assert kept("block_diagonal:2", 4, 4) == {(0, 0), (0, 1), (1, 0), (1, 1), (2, 2), (2, 3), (3, 2), (3, 3)}
    assert kept("mini_causal:2", 4, 4) == {(0, 0), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 2), (3, 0),
                                           (3, 1), (3, 2), (3, 3)}
    assert kept("prefix_lm:2", 3, 3) == {(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)}
    assert kept("dilated_sliding_window:3,2", 4, 4) == {(0, 0), (1, 1), (2, 0), (2, 2), (3, 1), (3, 3)}
    assert kept("document", 4, 4, numpy.array([[0, 0, 1, 1]])) == {(0, 0), (0, 1), (1, 0), (1, 1), (2, 2), (2, 3), (3, 2), (3, 3)}
    with pytest.raises(ValueError):
        mods.torch_mask_mod("document", 4, 4)


def test_score_mods_on_numbers():
    assert mods.torch_score_mod("none", 8) is None
    assert mods.torch_score_mod("rel_bias", 8)(0.5, 0, 0, 3, 7) == 4.5
    assert math.isclose(mods.torch_score_mod("alibi", 8)(1.0, 0, 1, 5, 2), 1.0 - 2.0 ** (-2.0) * 3)
    assert math.isclose(mods.torch_score_mod("softcap:2", 8)(3.0, 0, 0, 0, 0), 2 * math.tanh(1.5))


def test_random_document_ids():
    for K in (1, 3, 50):
        rows = mods.random_document_ids(2, 50, K, random.Random(K))
        for row in rows:
            assert len(row) == 50 and row[0] == 0 and row[-1] == K - 1
            assert all(b - a in (0, 1) for a, b in zip(row, row[1:]))
    with pytest.raises(ValueError):
        mods.random_document_ids(1, 4, 5, random.Random(0))


def test_benchmark_csv_columns():
    """scripts/bench_blocksparse.py writes bench.csv's columns (results_csv.COLUMNS), then mask and score."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import results_csv  # noqa: E402

    bench = _load("bench_blocksparse", "scripts/bench_blocksparse.py")
    assert tuple(bench.CSV_COLUMNS) == tuple(results_csv.COLUMNS) + ("mask", "score")
    # no quoting: commas become ';' (run_info.csv_text, the harness's csv_field)
    assert bench.run_info.csv_text("sliding_window:1024,0") == "sliding_window:1024;0"
    assert bench.FLEX_FLASH == "flex_attention(flash)" and bench.FLASH_OPTIONS == {"BACKEND": "FLASH"}


@pytest.mark.parametrize("text, parsed", [
    ("dmattn_topk", (1024, 64)), ("dmattn_topk:256", (256, 64)), ("dmattn_topk:256;0", (256, 0)),
    ("dmattn_topk:32,128", (32, 128)),
])
def test_benchmark_dmattn_cases(text, parsed):
    """dmattn_topk[:W[;BLOCK]]: the top-W mask of flash_attn_mma --mask topk, its defaults --window 1024 --block 64."""
    bench = _load("bench_blocksparse", "scripts/bench_blocksparse.py")
    assert bench.parse_dmattn_case(text) == parsed


def test_benchmark_dmattn_defaults_are_the_harness():
    """TOPK_DEFAULTS are flash_attn_mma's --window and --block defaults (bench/cli.h's Options)."""
    bench = _load("bench_blocksparse", "scripts/bench_blocksparse.py")
    source = open(os.path.join(ROOT, "bench", "cli.h"), encoding="utf-8").read()
    defaults = tuple(int(re.search(rf"int {name} = (\d+);", source)[1]) for name in ("window", "block"))
    assert bench.TOPK_DEFAULTS == defaults


@pytest.mark.parametrize("text", ["dmattn_topk:0", "dmattn_topk:", "dmattn_topk:8;", "dmattn_topk:8;1;2",
                                  "dmattn_topk:x", "dmattn_topk:1024+alibi", "dmattn_window:512", "dmattn"])
def test_bad_benchmark_dmattn_cases_are_one_line(text):
    bench = _load("bench_blocksparse", "scripts/bench_blocksparse.py")
    with pytest.raises(ValueError) as e:
        bench.parse_dmattn_case(text)
    assert "dmattn_topk[:W[;BLOCK]]" in str(e.value) and "\n" not in str(e.value)
