"""Results CSVs for the script tests: rows of the fake GPU's fixture
(tests/fixtures/results/FakeGPU-A/fwd.csv) with the fields a test changes."""
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import results_csv as rc  # noqa: E402

CSV_A = os.path.join(ROOT, "tests", "fixtures", "results", "FakeGPU-A", "fwd.csv")


def write_rows(path, rows, extra_columns=(), **defaults):
    """`path` as a results CSV (rc.COLUMNS, then `extra_columns`): one line per
    dict of `rows`, over the fixture's first row, status PASS, and `defaults`."""
    with open(CSV_A, newline="", encoding="utf-8") as f:
        template = next(csv.DictReader(f))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=rc.COLUMNS + tuple(extra_columns))
        w.writeheader()
        for row in rows:
            w.writerow({**template, "status": "PASS", **defaults, **row})
