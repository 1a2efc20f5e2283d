#!/usr/bin/env bash
# Session 16, third device call: rung 10 +stage2 pipelined over three tiles (Σ of
# tile j+2 sent while tile j+1 is finished, both under P_j·V_j). The same
# calls as session16_a.sh (build, one-tile check, variant tests, sanitizers,
# the D = 1024 benchmark twice and causal once), every row shown.
SHOW=--show-all exec bash "$(dirname "$0")/session16_a.sh"
