"""Rung 07's decoded descriptors (scripts/wgmma_desc.py, the primer's block): the fields as the PTX ISA
lays them out, and the claim the primer makes about them: the hardware's address swizzle, applied to what
each descriptor describes, finds every element where Sw128Blocks stored it, +32 bytes per k-step included."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import figures  # noqa: E402
import wgmma_desc as wd  # noqa: E402

D = wd.D


@pytest.fixture(scope="module")
def lay():
    return wd.layout(wd.read(ROOT, wd.RUNG07), wd.read(ROOT, wd.WGMMA))


def swizzled(addr):
    """SWIZZLE_128B on a byte address: bits 4-6 XOR bits 7-9 (PTX ISA, "Shared Memory Matrix Layout")."""
    return addr ^ (((addr >> 7) & 7) << 4)


def test_the_fields_decode_as_encoded():
    desc = wd.make_sw128_desc(0x12340, 16384, 1024)
    assert wd.fields(desc) == {"start": 0x1234, "lbo": 16384, "sbo": 1024, "base_offset": 0, "swizzle": 1}


def test_the_layout_is_rung_07s_at_d_128(lay):
    assert (lay["Br"], lay["Bc"]) == (128, 128)
    rows = {(name, kk): (byte, wd.fields(desc)) for name, kk, byte, desc in wd.descriptors(lay)}
    assert [rows[("Q, warpgroup 0", kk)][0] for kk in range(8)] == [0, 32, 64, 96, 16384, 16416, 16448, 16480]
    assert rows[("Q, warpgroup 1", 0)][0] == 8192 and rows[("K, slot 0", 0)][0] == 32768
    assert [rows[("V, slot 0", kk)][0] for kk in range(3)] == [98304, 100352, 102400]
    assert rows[("K, slot 0", 5)][1] == {"start": 49184 >> 4, "lbo": 0, "sbo": 1024, "base_offset": 0, "swizzle": 1}
    assert rows[("V, slot 0", 0)][1]["lbo"] == 16384


def test_every_k_step_start_keeps_the_row_bits_so_base_offset_is_zero(lay):
    for name, kk, byte, desc in wd.descriptors(lay):
        assert (byte >> 7) & 7 == 0, f"{name} k-step {kk} starts off the 1024-byte pattern's rows"
        assert wd.fields(desc)["base_offset"] == 0


def test_the_hardware_swizzle_finds_what_sw128blocks_stored(lay):
    Br, Bc = lay["Br"], lay["Bc"]
    text = wd.read(ROOT, wd.WGMMA)
    q_tile, kv_tile = figures.sw128_offset_function(text, Br), figures.sw128_offset_function(text, Bc)
    # Where each operand's element (row, col) was stored, in bytes past the tile base (B = 0).
    stored = {"Q, warpgroup 0": lambda r, c: 2 * q_tile(r, c),
              "Q, warpgroup 1": lambda r, c: 2 * q_tile(64 + r, c),
              "K, slot 0": lambda r, c: 2 * (Br * D + kv_tile(r, c)),
              "V, slot 0": lambda r, c: 2 * (Br * D + 2 * Bc * D + kv_tile(r, c))}
    for name, kk, _, desc in wd.descriptors(lay):
        f = wd.fields(desc)
        start = f["start"] << 4
        if name.startswith(("Q", "K")):  # K-major: 16 elements of each row, 8-row groups SBO apart
            for r in range(64 if name.startswith("Q") else Bc):
                for e in range(16):
                    hw = swizzled(start + (r // 8) * f["sbo"] + (r % 8) * 128 + 2 * e)
                    assert hw == stored[name](r, 16 * kk + e), (name, kk, r, e)
        else:  # V, MN-major: 16 key rows per k-step, 8-row groups SBO apart, 64-column blocks LBO apart
            for k in range(16):
                for n in range(D):
                    hw = swizzled(start + (k // 8) * f["sbo"] + (k % 8) * 128 + (n // 64) * f["lbo"] + 2 * (n % 64))
                    assert hw == stored[name](16 * kk + k, n), (kk, k, n)


def test_the_block_is_what_the_primer_shows():
    with open(os.path.join(ROOT, "docs", "hopper_primer.md"), encoding="utf-8") as f:
        page = f.read()
    assert f"{wd.BEGIN}\n{wd.render(ROOT)}\n{wd.END}" in page


def test_a_source_that_changed_shape_is_an_error(lay):
    text = wd.read(ROOT, wd.RUNG07)
    with pytest.raises(ValueError):
        wd.layout(text.replace("T* sV = sK + 2 * Cfg::kKVElems;", "T* sV = sK + 3 * Cfg::kKVElems;"),
                  wd.read(ROOT, wd.WGMMA))
    with pytest.raises(ValueError):
        wd.layout(text, wd.read(ROOT, wd.WGMMA).replace("<< 62;", "<< 63;"))
