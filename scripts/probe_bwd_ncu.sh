#!/usr/bin/env bash
# One-off probe: Nsight Compute on rung 14 and on cuDNN's backward, same shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/probe}; mkdir -p "$out"; SECONDS=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_BUILD_TESTS=ON > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j16 --target flash_attn_mma >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built at $SECONDS s"
B=build-gpu/flash_attn_mma
timeout 150 $B --B 1 --H 8 --N 4096 --D 128 --iters 5 > "$out/fwd.txt" 2>&1; echo "fwd rc=$? at $SECONDS s"
timeout 90 $B --B 1 --H 8 --N 4096 --D 128 --mask topk --window 2048 --bias --iters 5 > "$out/dmattn.txt" 2>&1; echo "dmattn rc=$? at $SECONDS s"
for d in 64 128; do for c in "" --causal; do
  timeout 100 $B --B 1 --H 8 --N 8192 --D $d $c --bwd --variant 'bwd-ws,bwd-ws~*' --sdpa --no-check --show-all --iters 10 >> "$out/knobs.txt" 2>&1
  echo "knobs D=$d $c rc=$? at $SECONDS s"; done; done
NCU=(ncu --clock-control none --set full --import-source yes)
for d in 64 128; do
  timeout 120 "${NCU[@]}" -k regex:bwd_ws_kernel -c 1 -o /tmp/ours$d $B --B 1 --H 8 --N 8192 --D $d --bwd \
    --variant bwd-ws --no-peers --no-check --warmup 0 --iters 1 > /tmp/ours$d.log 2>&1; echo "ncu ours $d rc=$? at $SECONDS s"
  cat > /tmp/cudnn.py <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn(1, 8, 8192, $d, device='cuda', dtype=torch.float16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v)
    do = torch.randn_like(o)
    for _ in range(2): torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
PY
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 /tmp/cudnn.py > /tmp/list$d.csv 2>&1
  name=$(python3 - /tmp/list$d.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; ki, vi = h.index('Kernel Name'), h.index('Metric Value')
best = max(rows[1:], key=lambda r: float(r[vi].replace(',', '')))
print(best[ki].split('(')[0].split('<')[0].split()[-1])
PY
)
  echo "cudnn $d longest kernel: $name"; grep -o '"[^"]*","[^"]*","[0-9.,]*"$' /tmp/list$d.csv | tail -12
  timeout 120 "${NCU[@]}" -k "regex:$name" -c 1 -o /tmp/cudnn$d python3 /tmp/cudnn.py > /tmp/cudnn$d.log 2>&1; echo "ncu cudnn $d rc=$? at $SECONDS s"
  for r in ours$d cudnn$d; do ncu --import /tmp/$r.ncu-rep --page details --print-units base > "$out/$r.txt" 2>&1; done
done
ncu --import /tmp/ours128.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > "$out/ours128_sass.csv.gz"
tail -5 /tmp/ours128.log /tmp/cudnn128.log
echo "done at $SECONDS s"
