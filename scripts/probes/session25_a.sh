#!/usr/bin/env bash
# Session 25 (a), written in session 24 (no device was lent): rung 12
# (ws-pingpong) on the H200 for the first time: its variant tests, the
# sanitizers on ragged shapes, then D = 64 / 128 / 256 (and D = 128 causal)
# against rung 07's overlap, rung 11 and the SDPA backends in one process
# each; ncu of the tensor pipe at D = 128. Beside it, a harness built with
# FlashAttention-3's tiles (-DATTNLAB_WS_D128_BC=176: 176 keys at D = 128;
# -DATTNLAB_WS_D64_WARPGROUPS=3: 192 rows in 3 warpgroups at D = 64): checked
# on odd shapes and timed against the defaults (128 keys; 2 warpgroups).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
export ATTNLAB_UNVERIFIED=1  # rung 12 runs only when asked, until this probe has passed
probe_build_ab "-DATTNLAB_WS_D128_BC=176 -DATTNLAB_WS_D64_WARPGROUPS=3" flash_attn_mma test_gpu_variants
run_test 300 test_gpu_variants 'ws*'
SAN_TOOLS='memcheck racecheck synccheck' variant_sanitizers 'ws+stage2+pingpong' \
  "--Nq 130 --Nk 77 --D 128 --causal" "--Nq 200 --Nk 333 --D 64 --dtype bf16" "--Nq 17 --Nk 300 --D 256 --causal"
SAN_TOOLS='racecheck' variant_sanitizers 'ws+stage2' "--Nq 130 --Nk 77 --D 128 --causal"
for args in "--D 64" "--D 128" "--D 256" "--D 128 --causal"; do
  echo "== $args"
  timeout 120 $F --B 1 --H 8 --N 8192 $args --variant 'ws*,wgmma+stage2+overlap,two-pass+stage4' --sdpa \
    --iters 20 --show-all 2>&1 | grep -E "TFLOPS|unsupported|FAIL" | cut -c1-150
done
el bench
chk() { timeout 60 $FB --B 2 --H 3 "$@" --variant 'ws*' --check --show-all --iters 1 --warmup 0 2>&1 | grep -E '^ *ws'; }
for d in 128 64; do
  for args in "--Nq 1000 --Nk 1000" "--Nq 17 --Nk 300 --causal" "--Nq 129 --Nk 4096 --dtype bf16" "--Nq 300 --Nk 177 --causal" \
              "--Nq 1 --Nk 1" "--Nq 500 --Nk 20 --causal"; do
    r=$(chk $args --D $d)
    echo "FA3-tile build D=$d $args: $(grep -c PASS <<< "$r") PASS, $(grep -vc PASS <<< "$r") not"
    grep -v PASS <<< "$r" | cut -c1-200
  done
done
for args in "--D 128" "--D 128 --causal" "--D 64" "--D 64 --causal"; do
  for bin in $F $FB $F $FB; do
    echo "$bin $args: $(timeout 60 $bin --B 1 --H 8 --N 8192 $args --variant 'ws*' --iters 20 --show-all 2>&1 |
      grep -E '^ *ws' | sed -E 's/\[.*\], //' | cut -c1-70 | tr '\n' ' ')"
  done
done
el "FA3-tile A/B"
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
for v in ws+stage2 ws+stage2+pingpong wgmma+stage2+overlap; do
  echo "ncu $v D=128: $(timeout 90 ncu --clock-control none --metrics $M -k regex:"ws_kernel|wgmma_overlap" -c 1 $F \
    --B 1 --H 8 --N 8192 --D 128 --variant "$v" --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
done
el done
