#!/usr/bin/env bash
# probe: build, memcheck the dynamic-mask paths, per-kernel times (ncu), reference + python tests
cd "$(dirname "$0")/../.."
B=build-gpu
{ cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build $B -j 16; } > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
F=$B/flash_attn_mma
for s in "--Nq 1 --Nk 3000 --D 128 --Hkv 1 --mask topk --window 64 --bias --splits 4" "--Nq 70 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 32 --bias --bwd" "--B 2 --Nq 130 --Nk 77 --D 128 --mask topk --window 16 --block 0 --bias --deterministic" "--Nq 1 --Nk 5000 --D 64 --mask topk --window 100 --block 0 --bias --splits 37"; do
  echo "memcheck $s: $(timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $F --H 2 $s --iters 1 --warmup 0 --check 2>&1 | grep -E 'ERROR SUMMARY|FAIL' | tr '\n' ' ')"
done > $OUT/memcheck.txt 2>&1
cat $OUT/memcheck.txt
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:"mask_summary|dma_forward_kernel|dma_combine|dma_bwd" --launch-count 8 $F --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --iters 1 --warmup 0 --bwd > $OUT/ncu.txt 2>&1
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:"mask_summary|dma_forward_kernel|dma_combine" --launch-count 3 $F --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 32768 --D 128 --causal --mask topk --window 1024 --block 0 --bias --iters 1 --warmup 0 >> $OUT/ncu.txt 2>&1
grep -E "^  [a-z_]+.*\(|gpu__time|dram__" $OUT/ncu.txt | sed 's/(int, int, int)//' | cut -c1-150
timeout 200 $B/test_dmattn > $OUT/fwd_tests.txt 2>&1; echo "test_dmattn rc=$? $(tail -1 $OUT/fwd_tests.txt)"; grep -m5 FAIL $OUT/fwd_tests.txt | cut -c1-200
timeout 200 $B/test_dmattn_backward > $OUT/bwd_tests.txt 2>&1; echo "test_dmattn_backward rc=$? $(tail -1 $OUT/bwd_tests.txt)"; grep -m5 FAIL $OUT/bwd_tests.txt | cut -c1-200
timeout 200 $B/test_dmattn_reference > $OUT/ref.txt 2>&1; echo "test_dmattn_reference rc=$? $(tail -1 $OUT/ref.txt)"; grep -E "FAIL|topk speed" $OUT/ref.txt | head
PYTHONPATH=$B/python timeout 240 python3 -m pytest tests/python/test_dynamic_mask.py -q -x > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; tail -15 $OUT/pytest.txt
for a in "--H 8 --N 8192 --mask ones" "--H 8 --N 8192 --D 64 --mask ones" "--H 8 --N 8192 --D 256 --mask ones" "--Hkv 1 --N 32768 --causal --mask topk --window 1024" "--Hkv 1 --Nq 1 --Nk 32768 --causal --mask topk --window 1024 --block 0" "--Hkv 1 --Nq 1 --Nk 524288 --causal --mask topk --window 1024 --block 0"; do
  timeout 100 $F --B 1 --H 2 --D 128 --bias $a --sdpa --torch --iters 10 --warmup 2 2>&1 | grep -E "dmattn|sdpa|split-q|error" | cut -c1-200
done
