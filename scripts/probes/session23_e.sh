#!/usr/bin/env bash
# Session 23 (e): the review's refactors (env_switch_on, one predicated tensor
# store, stage2's fence) rechecked on the H200: rung 11's variant tests with
# the early chunks on and off and with ATTNLAB_NO_PDL=1 (its reader moved;
# pass 2 is the PDL launch), and the sanitizers on two two-pass shapes.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
run_test 480 test_gpu_variants 'two-pass*'
ATTNLAB_TWO_PASS_NO_EARLY_MMA=1 run_test 480 test_gpu_variants 'two-pass+stage4'
ATTNLAB_NO_PDL=1 run_test 480 test_gpu_variants 'two-pass+stage4'
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers two-pass+stage4 "--Nq 256 --Nk 300 --D 256 --causal" "--Nq 70 --Nk 130 --D 1024 --causal --dtype bf16"
el done
