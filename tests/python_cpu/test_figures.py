"""The docs' layout figures are read from the kernels' sources (scripts/figures.py); what they read is checked
here against the PTX ISA's layouts and the rules the pages state. (That the committed PNGs are what
regenerate.py draws: test_regenerate.py.)"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import figures  # noqa: E402


def source(parts):
    return figures.read(ROOT, parts)


def test_the_fragment_layout_is_the_ptx_isas():
    layout = figures.fragment_layout(source(figures.PTX))
    for lane in range(32):
        g, t = lane // 4, lane % 4  # PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"
        for k in range(2):
            assert layout["A"][(g, 2 * t + k)] == (lane, f"a0.{'xy'[k]}")
            assert layout["A"][(g + 8, 2 * t + k)] == (lane, f"a1.{'xy'[k]}")
            assert layout["A"][(g, 2 * t + 8 + k)] == (lane, f"a2.{'xy'[k]}")
            assert layout["A"][(g + 8, 2 * t + 8 + k)] == (lane, f"a3.{'xy'[k]}")
            assert layout["C"][(g, 2 * t + k)] == (lane, f"c{k}")
            assert layout["C"][(g + 8, 2 * t + k)] == (lane, f"c{2 + k}")


def test_the_swizzle_is_chunk_c_at_c_xor_row():
    offset = figures.sw128_offset_function(source(figures.WGMMA))
    for row in range(64):
        for col in range(128):
            block, c = col // 64, (col % 64) // 8
            assert offset(row, col) == block * 64 * 8 + row * 64 + ((c ^ (row % 8)) * 8) + col % 8, (row, col)


def test_the_partitions_are_the_rungs_tiles():
    p = figures.partitions(source(figures.RUNG01), source(figures.RUNG02))
    assert p["01"] == {"kBr": 64, "kBc": 64, "kWarps": 8, "kWarpRowsS": 2, "kWarpKeysS": 4, "kWarpRowsO": 4,
                       "kWarpColsO": 2}
    assert p["02"] == {"kBr": 128, "kBc": 64, "kWarps": 4, "kMTiles": 2}


def test_the_ring_keeps_every_waiter_within_one_phase():
    stages = figures.ring_stages(source(figures.FWD_TILE))
    assert stages == 2
    loads, work, full_done, empty_done = figures.ring_schedule(stages, tiles=12)
    for g, start, _ in loads:
        if g >= stages:
            assert start >= empty_done[g - stages], "a slot refilled before both consumers released it"
            # ... and its empty barrier's phase g / S - 1 is the one with the parity the producer waits for
            done = sorted(empty_done[h] for h in empty_done if h % stages == g % stages and empty_done[h] <= start)
            assert (len(done) - 1) & 1 == (g // stages - 1) & 1
    for c in (0, 1):
        for g, start, _ in work[c]:
            done = [full_done[h] for h in full_done if h % stages == g % stages and full_done[h] <= start]
            assert len(done) - 1 == g // stages, "a consumer would see another phase of full than its tile's"


@pytest.mark.parametrize("parts, old, new", [
    (figures.PTX, "a2 = A[g][2t+8..2t+9]", "a2 = A[g][2t+4..2t+5]"),
    (figures.WGMMA, "static int offset(int row, int col)", "static int offset_of(int row, int col)"),
    (figures.RUNG02, "struct SplitQTiles<64>", "struct SplitQTiles<80>"),
    (figures.FWD_TILE, "constexpr int kWsStages = 2;", "constexpr int kWsStages{2};"),
])
def test_a_source_that_changed_shape_is_an_error(parts, old, new):
    text = source(parts)
    assert old in text
    with pytest.raises(ValueError):
        {figures.PTX: figures.fragment_layout, figures.WGMMA: figures.sw128_offset_function,
         figures.RUNG02: lambda t: figures.partitions(source(figures.RUNG01), t),
         figures.FWD_TILE: figures.ring_stages}[parts](text.replace(old, new))
