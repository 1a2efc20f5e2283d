#!/usr/bin/env bash
# Session 16: the Python side of the mask summary (attnlab.build_mask_summary,
# dynamic_mask_attention(mask_summary=...)): build the module, the new tests
# (the same bits as the scanning run, forward and deterministic gradients;
# misuse raises), then tests/python/test_dynamic_mask.py in full.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build attnlab_python
PYTHONPATH=$B/python timeout 100 python3 -m pytest -q -p no:cacheprovider tests/python/test_dynamic_mask.py -k mask_summary -v 2>&1 | grep -E "PASS|FAIL|passed|failed|rror" | cut -c1-200
el "new tests done"
PYTHONPATH=$B/python timeout 240 python3 -m pytest -q -p no:cacheprovider tests/python/test_dynamic_mask.py > $L/pytest.log 2>&1
el "pytest rc=$? $(tail -1 $L/pytest.log)"
grep -E "FAILED|Error" $L/pytest.log | head -20 | cut -c1-240
