#!/usr/bin/env python3
"""The GEMM ceiling of attention at a large head dim, measured with cuBLAS.

Attention's forward does two GEMMs' worth of MMAs, S = Q·Kᵀ and O = P·V,
2·N²·D FLOPs each per head, and nothing else that a tensor core runs. So no
attention kernel can beat two cuBLAS GEMMs of those shapes by more than it
beats cuBLAS itself. This times, in one process, with CUDA events after an
L2 flush (median of 20): the two GEMMs alone (torch.bmm into preallocated
outputs), torch's unfused attention (matmul, scale, softmax, matmul: the
harness's torch(unfused) row) and a square 8192³ GEMM, and prints what ratio
to torch(unfused) the GEMMs alone would reach.

Run: python3 scripts/gemm_ceiling.py [--D 1024 512]   (gpu_check.sh runs it after the D = 1024 benchmarks)
"""
import argparse
import statistics

try:
    import torch
except ImportError:
    torch = None


def median_ms(fn, flush, iters=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", type=int, nargs="+", default=[1024, 512])
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    args = ap.parse_args()
    if torch is None:
        raise SystemExit("gemm_ceiling: needs PyTorch (import torch failed)")
    if not torch.cuda.is_available():
        raise SystemExit("gemm_ceiling: no CUDA GPU")
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)  # 256 MiB, > the 60 MiB L2
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | CUDA {torch.version.cuda} | fp16, "
          f"{args.heads} heads, N = {args.N}")
    n = 8192
    a, b, c = (torch.randn(n, n, device=dev, dtype=dt) for _ in range(3))
    t = median_ms(lambda: torch.mm(a, b, out=c), flush)
    print(f"square GEMM {n}^3: {t:.3f} ms, {2 * n ** 3 / t / 1e9:.1f} TFLOPS")
    del a, b, c
    h, N = args.heads, args.N
    for D in args.D:
        q, k, v = (torch.randn(h, N, D, device=dev, dtype=dt) for _ in range(3))
        s = torch.empty(h, N, N, device=dev, dtype=dt)
        o = torch.empty(h, N, D, device=dev, dtype=dt)
        p = torch.softmax(torch.randn(h, N, N, device=dev, dtype=dt), -1)
        kt = k.transpose(1, 2)
        scale = D ** -0.5
        gemm_flops = 2 * h * N * N * D
        t_qk = median_ms(lambda: torch.bmm(q, kt, out=s), flush)
        t_pv = median_ms(lambda: torch.bmm(p, v, out=o), flush)
        t_unfused = median_ms(lambda: torch.matmul(torch.softmax(torch.matmul(q, kt).mul_(scale), -1), v), flush)
        attn_flops = 2 * gemm_flops  # the suite's convention: 2·(D + Dv)·pairs per head
        print(f"D = {D}: Q·Kᵀ {t_qk:.3f} ms ({gemm_flops / t_qk / 1e9:.1f} TFLOPS), "
              f"P·V {t_pv:.3f} ms ({gemm_flops / t_pv / 1e9:.1f} TFLOPS); both {t_qk + t_pv:.3f} ms = "
              f"{attn_flops / (t_qk + t_pv) / 1e9:.1f} attention TFLOPS")
        print(f"D = {D}: torch(unfused) {t_unfused:.3f} ms ({attn_flops / t_unfused / 1e9:.1f} TFLOPS); "
              f"the two GEMMs alone reach {t_unfused / (t_qk + t_pv):.2f}x torch(unfused); 2x would need "
              f"{2 * attn_flops / t_unfused / 1e9:.1f} TFLOPS")
        del q, k, v, s, o, p, kt


if __name__ == "__main__":
    main()
