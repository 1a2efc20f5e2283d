#!/usr/bin/env bash
# Session 18: the backward's small passes — Δ by 16-byte loads with dq_accum
# zeroed in the same pass (no memset), dQ converted four elements at a time,
# q/k/v/dO alignment refused in C++ and copied aligned in the Python binding.
# test_dmattn_backward (with O at +2 and dQ at +4 bytes, a dO 2 bytes off
# refused), the Python dynamic-mask tests, sanitizers on the backward, ncu
# kernel durations of one backward call, and the backward rows (D=128, 64)
# against this session's gpu_check at 86eb4eb (2.368 / 1.338 ms).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn_backward attnlab_python
run_test 300 test_dmattn_backward
PYTHONPATH=$B/python timeout 300 python3 -m pytest tests/python/test_dynamic_mask.py -q -x > $L/pytest.log 2>&1
el "pytest rc=$? $(tail -1 $L/pytest.log)"; grep -m5 -E "FAIL|Error" $L/pytest.log | cut -c1-200
bwd_sanitizers
for D in 64 128; do
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --print-units base --csv \
    $F --B 1 --H 8 --N 8192 --D $D --mask ones --bias --bwd --iters 1 --warmup 0 > $L/ncu_$D.csv 2>&1
  el "ncu D=$D rc=$?"
  python3 scripts/probes/ncu_kernel_times.py "$L/ncu_$D.csv" --from dma_bwd
done
for rep in 1 2; do for D in 128 64; do echo "all-active D=$D: $(bwd_row $F $BWD_DENSE --D $D)"; done; done
echo "all-active causal D=64: $(bwd_row $F $BWD_DENSE --D 64 --causal)"
el done
