#!/usr/bin/env bash
# Session 22 (d): rung 11 in rounds. The variant tests now also run each
# two-pass row with 1/3, 1/7 and 7/48 of the workspace it asks for (rounds of
# an even number of row blocks, paired in pass 1; of an odd number, unpaired;
# of one). Rounds now hold an even number of row blocks where the workspace
# fits one more, so B=1 H=48 N=16384 D=512 (13 rounds of 473 before: pass 1
# unpaired) runs paired: A/B in one binary, ATTNLAB_TWO_PASS_NO_MULTICAST=1
# giving what ran before (unpaired).
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_gpu_variants
run_test 480 test_gpu_variants 'two-pass*'
ab() {
  echo "== $*"
  echo "paired:   $(timeout 120 $F "$@" --variant 'two-pass+stage4' --iters 10 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
  echo "unpaired: $(ATTNLAB_TWO_PASS_NO_MULTICAST=1 timeout 120 $F "$@" --variant 'two-pass+stage4' --iters 10 2>&1 | grep -E "^ *two-pass" | cut -c1-120)"
}
ab --B 1 --H 48 --N 16384 --D 512
ab --B 1 --H 48 --N 16384 --D 512
ab --B 1 --H 8 --N 8192 --D 1024
el done
