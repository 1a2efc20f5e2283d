#!/usr/bin/env bash
# Shared-memory bank conflicts of the padded and the swizzled split-Q kernel, by
# ncu's hardware counters (one launch each, clocks left alone).
#   scripts/ncu_bank_conflicts.sh build/flash_attn_mma [D]
set -uo pipefail
bin=${1:-build/flash_attn_mma}
D=${2:-64}
metrics=smsp__inst_executed_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum
for variant in split-q+stage2 split-q+swizzle+stage2; do
  echo "== $variant, B=1 H=8 N=4096 D=$D fp16"
  ncu --clock-control none -k regex:split_q_kernel -c 1 --metrics "$metrics" \
    "$bin" --B 1 --H 8 --N 4096 --D "$D" --variant "$variant" --iters 1 --warmup 0 --no-check --no-peers 2>&1 |
    grep -E "^\s+(smsp|l1tex|gpu__)" | sed 's/^ \+/  /'
done
