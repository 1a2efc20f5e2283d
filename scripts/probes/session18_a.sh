#!/usr/bin/env bash
# Session 18: the forward's in-kernel mask scan now stores its tile bits as
# the mask summary, so the backward that follows it reads the mask no second
# time (as it already did after a pre-pass forward). A/B in one binary:
# `--bwd-own-prepass` (the backward runs its own pre-pass: the time of a
# backward called alone, and the default before this change) against the
# default, alternating, twice; then the backward rows with their torch peers
# (FA2's backward without mask or bias in the same process). Run after
# gpu_check (reuses its build-gpu), or builds it.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
[ -x $F ] || probe_build flash_attn_mma
own() { echo "$1 own pre-pass: $(bwd_row "$F" "${@:2}" --bwd-own-prepass)"; echo "$1 forward's:     $(bwd_row "$F" "${@:2}")"; }
for rep in 1 2; do
  for D in 128 64; do own "all-active D=$D" $BWD_DENSE --D $D; done
  own "all-active causal D=64" $BWD_DENSE --D 64 --causal
  own "GQA B=2 H=8 Hkv=2 N=4096 causal D=64" --B 2 --H 8 --Hkv 2 --N 4096 --D 64 --causal --mask topk --window 4096 --block 0 --bias
  for N in 8192 16384 32768; do own "top-1024 L=$N" $BWD_SPARSE --N $N; done
done
for D in 128 64; do echo "== peers D=$D"; bwd_peers $BWD_DENSE --D $D; done
el done
