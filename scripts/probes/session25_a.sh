#!/usr/bin/env bash
# Session 25 (a), written in session 24 (no device was lent): rung 12
# (ws-pingpong) on the H200 for the first time: its variant tests, the
# sanitizers on ragged shapes, then D = 64 / 128 / 256 (and D = 128 causal)
# against rung 07's overlap, rung 11 and the SDPA backends in one process
# each; ncu of the tensor pipe at D = 128. Beside it, a harness built with
# -DATTNLAB_WS_D128_BC=176 (FlashAttention-3's D = 128 tile): checked on odd
# shapes and timed against the default's 128 at D = 128.
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
export ATTNLAB_UNVERIFIED=1  # rung 12 runs only when asked, until this probe has passed
probe_build_ab "-DATTNLAB_WS_D128_BC=176" flash_attn_mma test_gpu_variants
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
for args in "--Nq 1000 --Nk 1000" "--Nq 17 --Nk 300 --causal" "--Nq 129 --Nk 4096 --dtype bf16" "--Nq 300 --Nk 177 --causal"; do
  echo "Bc=176 check $args: $(timeout 60 $FB --B 2 --H 3 $args --D 128 --variant 'ws*' --check --show-all --iters 1 \
    --warmup 0 2>&1 | grep -cE '^ *ws.*PASS') PASS, $(timeout 60 $FB --B 2 --H 3 $args --D 128 --variant 'ws*' --check \
    --show-all --iters 1 --warmup 0 2>&1 | grep -cE 'FAIL') FAIL"
done
for args in "--D 128" "--D 128 --causal"; do
  for bin in $F $FB $F $FB; do
    echo "$bin $args: $(timeout 60 $bin --B 1 --H 8 --N 8192 $args --variant 'ws*' --iters 20 --show-all 2>&1 |
      grep -E '^ *ws' | sed -E 's/\[.*\], //' | cut -c1-70 | tr '\n' ' ')"
  done
done
el "Bc A/B"
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
for v in ws+stage2 ws+stage2+pingpong wgmma+stage2+overlap; do
  echo "ncu $v D=128: $(timeout 90 ncu --clock-control none --metrics $M -k regex:"ws_kernel|wgmma_overlap" -c 1 $F \
    --B 1 --H 8 --N 8192 --D 128 --variant "$v" --iters 1 --warmup 0 2>&1 | grep -E "gpu__|sm__" |
    awk '{print $1 "=" $NF}' | tr '\n' ' ')"
done
el done
