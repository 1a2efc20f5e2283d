#!/usr/bin/env bash
# Session 22 (e): test_gpu_variants after its two loops were folded onto
# shared helpers (set_up, run_and_record): the two-pass rows (442 expected,
# as in session22_d) and the split-q rows, to see both loops still count and
# pass what they did.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build test_gpu_variants
run_test 300 test_gpu_variants 'two-pass*'
run_test 300 test_gpu_variants 'split-q*'
el done
