#!/usr/bin/env python3
"""Decode rung 07's wgmma descriptors at D = 128, from the code's own constants.

    python3 scripts/wgmma_desc.py [--root DIR]     # prints the primer's block

Reads kernels/flash_attn/07_wgmma.cu (WgmmaTiles<128>, where the overlap
kernel puts sQ, sK, sV and a warpgroup's rows of Q) and
kernels/common/wgmma.cuh (make_sw128_desc's bit fields and the descriptor
arguments of wgmma_qk_tile and wgmma_pv_tile, which are evaluated as written),
and writes the block between
    <!-- wgmma-desc:begin --> ... <!-- wgmma-desc:end -->
in docs/hopper_primer.md (scripts/regenerate.py fills it): for every k-step,
the start address of Q, K (K-major) and V (MN-major, read transposed) as bytes
past the 1024-byte-aligned tile base and as the descriptor's start field, and
the fixed fields (LBO, SBO, base offset, swizzle) with the whole 64-bit value.
Raises ValueError when the sources no longer say what is read from them.
"""
import argparse
import os
import re
import sys

BEGIN, END = "<!-- wgmma-desc:begin -->", "<!-- wgmma-desc:end -->"
RUNG07 = ("kernels", "flash_attn", "07_wgmma.cu")
WGMMA = ("kernels", "common", "wgmma.cuh")
D = 128
ELEM = 2  # bytes of a 16-bit element


def read(root, parts):
    with open(os.path.join(root, *parts), encoding="utf-8") as f:
        return f.read()


def found(root):
    return all(os.path.isfile(os.path.join(root, *p)) for p in (RUNG07, WGMMA))


def need(pattern, text, parts, flags=0):
    m = re.search(pattern, text, flags)
    if m is None:
        raise ValueError(f"{'/'.join(parts)} no longer has what wgmma_desc.py reads: /{pattern}/")
    return m


# make_sw128_desc as written in wgmma.cuh (PTX ISA, "Matrix Descriptor Format"): each statement is
# checked to be there, then mirrored.
DESC_LINES = (r"uint64_t desc = \(addr & 0x3FFFFu\) >> 4;",
              r"desc \|= uint64_t\(\(lbo_bytes >> 4\) & 0x3FFFu\) << 16;",
              r"desc \|= uint64_t\(\(sbo_bytes >> 4\) & 0x3FFFu\) << 32;",
              r"desc \|= uint64_t\(1\) << 62;")


def make_sw128_desc(addr, lbo, sbo):
    return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62)


def fields(desc):
    """The descriptor's fields: start (16-byte units), LBO and SBO (bytes), base offset, swizzle mode."""
    return {"start": desc & 0x3FFF, "lbo": ((desc >> 16) & 0x3FFF) << 4, "sbo": ((desc >> 32) & 0x3FFF) << 4,
            "base_offset": (desc >> 49) & 7, "swizzle": (desc >> 62) & 3}


def c_expr(expr, **names):
    """A C++ integer expression of the sources, evaluated (integer division as C++'s, for these non-negatives)."""
    py = re.sub(r"(?<![/])/(?![/])", "//", expr)
    return eval(compile(py, "expr", "eval"), {"__builtins__": {}}, dict(names))


def layout(rung07, wgmma):
    """Constants and the descriptor arguments, from the sources."""
    for line in DESC_LINES:
        need(line, wgmma, WGMMA)
    tiles = need(rf"struct WgmmaTiles<{D}>\s*\{{ static constexpr int kBc = (\d+), kWarpgroups = (\d+); \}};", rung07,
                 RUNG07)
    Bc, warpgroups = map(int, tiles.groups())
    Br = 64 * warpgroups  # kBr = 64 * kWarpgroups
    need(r"static constexpr int kBr = 64 \* kWarpgroups;", rung07, RUNG07)
    need(r"T\* sK = sQ \+ Cfg::kQElems;", rung07, RUNG07)
    need(r"T\* sV = sK \+ 2 \* Cfg::kKVElems;", rung07, RUNG07)
    wg_rows = need(r"const T\* sQ_wg = sQ \+ warpgroup \* (\d+ \* \d+);", rung07, RUNG07).group(1)
    qk = need(r"wgmma_ss<T, Bc>\(S, make_sw128_desc\(sQ \+ ([^,]+), (\w+), (\w+)\),\s*"
              r"make_sw128_desc\(sK \+ ([^,]+), (\w+), (\w+)\), kk > 0\);", wgmma, WGMMA)
    pv = need(r"wgmma_rs_vt<T, D>\(O, P\[kk\], make_sw128_desc\(sV \+ ([^,]+), ([^,]+), (\w+)\)\);", wgmma, WGMMA)
    return {"Bc": Bc, "Br": Br, "wg_rows": wg_rows, "qk": qk.groups(), "pv": pv.groups()}


def descriptors(lay):
    """[(operand, kk, byte offset from the tile base, descriptor at tile base 0)] for every k-step at D = 128."""
    Bc, Br = lay["Bc"], lay["Br"]
    q_elems, kv_elems = Br * D, Bc * D
    bases = {"sQ": 0, "sK": q_elems, "sV": q_elems + 2 * kv_elems}  # slot 0 of each ring
    q_off, q_lbo, q_sbo, k_off, k_lbo, k_sbo = lay["qk"]
    v_off, v_lbo, v_sbo = lay["pv"]
    wg1 = c_expr(lay["wg_rows"])
    out = []
    for kk in range(D // 16):
        for name, base, off, lbo, sbo in (("Q, warpgroup 0", bases["sQ"], q_off, q_lbo, q_sbo),
                                          ("Q, warpgroup 1", bases["sQ"] + wg1, q_off, q_lbo, q_sbo),
                                          ("K, slot 0", bases["sK"], k_off, k_lbo, k_sbo)):
            byte = (base + c_expr(off, kk=kk, kQRows=Br, Bc=Bc)) * ELEM
            out.append((name, kk, byte, make_sw128_desc(byte, c_expr(lbo, Bc=Bc), c_expr(sbo, Bc=Bc))))
    for kk in range(Bc // 16):
        byte = (bases["sV"] + c_expr(v_off, kk=kk, Bc=Bc)) * ELEM
        out.append(("V, slot 0", kk, byte, make_sw128_desc(byte, c_expr(v_lbo, Bc=Bc), c_expr(v_sbo, Bc=Bc))))
    return out


def block(lay):
    """The markdown between the markers."""
    rows = descriptors(lay)
    by = {}
    for name, kk, byte, desc in rows:
        by.setdefault(name, {})[kk] = (byte, desc)
    names = ("Q, warpgroup 0", "K, slot 0", "V, slot 0")
    wg1 = by["Q, warpgroup 1"][0][0] - by["Q, warpgroup 0"][0][0]
    lines = ["<!-- generated by scripts/regenerate.py (wgmma_desc.py) from kernels/flash_attn/07_wgmma.cu and "
             "kernels/common/wgmma.cuh; edit the code, not this block -->",
             f"Rung 07 at D = {D} (Br = {lay['Br']}, Bc = {lay['Bc']}): each k-step's start as bytes past the "
             "1024-byte-aligned tile base B, and in brackets n of the start field B/16 + n. Warpgroup 1's Q is "
             f"{wg1} bytes further, slot 1 of K and of V {2 * lay['Bc'] * D} further.", "",
             "| kk | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for kk in range(D // 16):
        lines.append(f"| {kk} | " + " | ".join(f"{by[n][kk][0]} ({by[n][kk][0] >> 4})" for n in names) + " |")
    lines += ["", "| operand | major | LBO (bytes) | SBO (bytes) | base offset | swizzle | the other bits: desc − start |",
              "|---|---|---:|---:|---:|---|---|"]
    for name, major in (("Q, warpgroup 0", "K-major"), ("K, slot 0", "K-major"), ("V, slot 0", "MN-major (trans-b)")):
        byte, desc = by[name][0]
        f = fields(desc)
        swz = {1: "1 (128-byte)", 2: "2 (64-byte)", 3: "3 (32-byte)", 0: "0 (none)"}[f["swizzle"]]
        lines.append(f"| {name} | {major} | {f['lbo']} | {f['sbo']} | {f['base_offset']} | {swz} | "
                     f"`0x{desc - (byte >> 4):016x}` |")
    return "\n".join(lines)


def render(root):
    if not found(root):
        raise ValueError(f"{BEGIN} needs {'/'.join(RUNG07)} and {'/'.join(WGMMA)} under {root}")
    return block(layout(read(root, RUNG07), read(root, WGMMA)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args(argv)
    try:
        print(render(args.root))
    except (OSError, ValueError) as e:
        print(f"wgmma_desc.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
