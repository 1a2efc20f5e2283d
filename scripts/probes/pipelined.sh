#!/usr/bin/env bash
# Session 7: the pipelined pre-pass (--dma-mask-scan pipelined): the pre-pass
# in chunks of query tiles, each chunk's forward on a high-priority side
# stream as soon as its bits exist. Tests (every masked case also pipelined),
# then the rows it should move against the plain pre-pass / in-kernel scan.
# (ATTNLAB_PREPASS_WARPS, the 4-warp pre-pass switch of 8305d2e, is removed
# since: on later commits the t4 rows repeat the 8-warp ones.)
cd "$(dirname "$0")/../.."
. scripts/probes/common.sh
probe_build flash_attn_mma test_dmattn test_dmattn_summary
timeout 60 $B/test_dmattn_summary > $L/summary_tests.log 2>&1; el "test_dmattn_summary rc=$? $(tail -1 $L/summary_tests.log)"
ATTNLAB_PREPASS_WARPS=4 timeout 60 $B/test_dmattn_summary > $L/summary_tests4.log 2>&1; el "test_dmattn_summary (4-warp pre-pass) rc=$? $(tail -1 $L/summary_tests4.log)"
timeout 240 $B/test_dmattn > $L/fwd_tests.log 2>&1; el "test_dmattn rc=$? $(tail -1 $L/fwd_tests.log) $(grep -c 'pipelined' $L/fwd_tests.log) pipelined lines"; grep -m12 FAIL $L/fwd_tests.log | cut -c1-240
echo "memcheck pipelined: $(timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $F --B 2 --H 4 --Hkv 2 --Nq 1000 --Nk 1300 --D 64 --causal --mask topk --window 100 --bias --dma-mask-scan pipelined --dma-prepass-chunks 5 --check --iters 1 --warmup 0 2>&1 | grep -E 'ERROR SUMMARY|FAIL|PASS' | cut -c1-60 | tr '\n' ' ')"
echo "check L=8K pipelined: $(timeout 60 $F --B 1 --H 2 --Hkv 1 --N 8192 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan pipelined --check --iters 1 --warmup 0 2>&1 | grep -E '^ *dmattn' | cut -c1-90)"
E=ATTNLAB_UNUSED=0
t() { timeout 20 env $E $F "$@" --iters 30 --warmup 5 2>&1 | grep -E "^ *dmattn|rror" | sed -E 's/ +dmattn: time:/ /; s/ms, effective TFLOPS:/ /' | cut -c1-20; }
T="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --bias"
P="--dma-mask-scan pipelined --dma-prepass-chunks"
t4() { E=ATTNLAB_PREPASS_WARPS=4 t "$@"; }  # the pre-pass in 4-warp blocks
for n in 32768 16384; do
  echo "L=$n W=1024: prepass $(t $T --N $n --window 1024 --dma-mask-scan prepass) | 4w $(t4 $T --N $n --window 1024 --dma-mask-scan prepass) | in-kernel $(t $T --N $n --window 1024 --dma-mask-scan in-kernel)"
  for c in 2 3 4 6 8; do echo "   pipe$c $(t $T --N $n --window 1024 $P $c) | 4w $(t4 $T --N $n --window 1024 $P $c)"; done
done
echo "L=8K W=1024: in-kernel $(t $T --N 8192 --window 1024) | pipe2 $(t $T --N 8192 --window 1024 $P 2) | pipe4 $(t $T --N 8192 --window 1024 $P 4)"
echo "L=32K W=32: prepass $(t $T --N 32768 --window 32 --dma-mask-scan prepass) | pipe2 $(t $T --N 32768 --window 32 $P 2) | pipe4 $(t $T --N 32768 --window 32 $P 4) | pipe8 $(t $T --N 32768 --window 32 $P 8)"
echo "L=32K W=8192: prepass $(t $T --N 32768 --window 8192 --dma-mask-scan prepass) | pipe4 $(t $T --N 32768 --window 8192 $P 4) | pipe8 $(t $T --N 32768 --window 8192 $P 8)"
H8="--B 1 --H 8 --Hkv 1 --D 128 --causal --mask topk --bias --window 1024 --N 32768"
echo "H=8 L=32K: prepass $(t $H8 --dma-mask-scan prepass) | pipe2 $(t $H8 $P 2) | pipe4 $(t $H8 $P 4) | 4w pipe4 $(t4 $H8 $P 4)"
for d in 128 64; do
  A="--B 1 --H 8 --N 8192 --D $d --mask ones --bias"
  echo "all-ones D=$d: prepass $(t $A --dma-mask-scan prepass) | pipe2 $(t $A $P 2) | pipe4 $(t $A $P 4) | pipe8 $(t $A $P 8) | 4w pipe4 $(t4 $A $P 4)"
done
echo "dense split-q D=64: $(timeout 30 $F --B 1 --H 8 --N 8192 --D 64 --variant 'split-q+stage2' --iters 30 --warmup 5 2>&1 | grep -E 'split-q\+stage2' | grep -o 'time:[0-9.]*ms' )"
el rows
for a in "--N 32768 $P 2" "--N 32768 $P 4"; do
  timeout 90 $F $T --window 1024 $a --sdpa --iters 10 --warmup 2 2>&1 | grep -E "^ *(dmattn|sdpa)" | cut -c1-150
done
timeout 60 nsys profile -o $L/pipe --force-overwrite true $F $T --N 32768 --window 1024 $P 4 --iters 3 --warmup 1 > /dev/null 2>&1 && timeout 60 nsys stats -r cuda_gpu_trace -f csv -o $L/pipe $L/pipe.nsys-rep > /dev/null 2>&1; ls $L/pipe* 2>/dev/null | head -3
python3 - <<'PY' 2>/dev/null
import csv,glob
f=glob.glob('/tmp/logs/pipe*gpu_trace*.csv')
if f:
    rows=list(csv.DictReader(open(f[0])))
    rows=[r for r in rows if 'mask_summary' in r.get('Name','') or 'dma_forward' in r.get('Name','')][-16:]
    t0=int(rows[0]['Start (ns)'])
    for r in rows: print('%8.1f %8.1f us  strm %s  %s' % ((int(r['Start (ns)'])-t0)/1e3, int(r['Duration (ns)'])/1e3, r.get('Strm',''), r['Name'][:40]))
PY
el done
tar czf $O/logs.tgz -C /tmp logs
