#!/usr/bin/env bash
# Session 7: gpu_check's exact racecheck command at D=1024 causal, 6 times; logs kept.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma
racecheck_runs 6
el done
