#!/usr/bin/env bash
# Session 19, after the final gpu_check: test_dmattn_backward after its
# refactor (one helper for the bitwise reruns; same checks), and the Python
# tests' own pytest report (ctest at 596afc8 passed them; this gives the count).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build test_dmattn_backward attnlab_python
run_test 250 test_dmattn_backward
PYTHONPATH=$B/python timeout 200 python3 -m pytest -q -p no:cacheprovider tests/python/test_dynamic_mask.py > $O/pytest_dynamic_mask.txt 2>&1
el "pytest rc=$? $(tail -1 $O/pytest_dynamic_mask.txt)"
grep -E "FAILED|Error" $O/pytest_dynamic_mask.txt | head -10
el done
