#!/usr/bin/env python3
"""Registers and spills of every kernel in a rung, from ptxas (-Xptxas -v).

    python3 scripts/ptxas_table.py kernels/flash_attn/02_split_q.cu [--arch 90a]

Prints one line per (head dim, stages, dtype): registers, spill bytes, smem.
Compiles here (no GPU needed).
"""
import argparse
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("--arch", default="90a")
    args = ap.parse_args()
    cmd = ["nvcc", "-std=c++17", "-O3", f"-gencode=arch=compute_{args.arch},code=sm_{args.arch}",
           "-Xptxas", "-v", "-c", args.source, "-o", "/dev/null"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr)
    rows, current = [], None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
            cfg = re.search(r"ConfigILi(\d+)ELi(\d+)E", name)
            dtype = "bf16" if "bfloat16" in name else "fp16"
            current = [f"D={cfg.group(1)}" if cfg else name[:40], f"stages={cfg.group(2)}" if cfg else "", dtype]
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current is not None:
            current.append(f"spill={m.group(1)}/{m.group(2)}B")
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current.insert(3, f"regs={m.group(1)}")
            rows.append(current)
            current = None
    for r in sorted(rows, key=lambda r: (int(r[0][2:]) if r[0][2:].isdigit() else 0, r[1], r[2])):
        print("  ".join(r))


if __name__ == "__main__":
    main()
