#!/usr/bin/env python3
"""One line per kernel of an ncu CSV run with --metrics gpu__time_duration.sum
--print-units base --csv (the program's own output may come first): ID,
duration in microseconds, kernel name (cut to 110 characters).

    ncu_kernel_times.py FILE [--from SUBSTRING]   (--from: start at the first
                                                   kernel whose name has it)
"""
import csv
import sys


def main():
    path = sys.argv[1]
    start = sys.argv[sys.argv.index("--from") + 1] if "--from" in sys.argv else ""
    rows = list(csv.reader(open(path)))
    at = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head = rows[at]
    name, value, kid = head.index("Kernel Name"), head.index("Metric Value"), head.index("ID")
    seen = not start
    for r in rows[at + 1:]:
        if len(r) != len(head):
            continue
        seen = seen or start in r[name]
        if seen:
            print(f"{r[kid]:>4} {float(r[value].replace(',', '')) / 1000:10.1f} us  {r[name][:110]}")


if __name__ == "__main__":
    main()
