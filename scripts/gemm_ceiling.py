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

It also measures the clock the card sustains under this load (the two GEMMs
back to back for a second, nvidia-smi sampling the SM clock meanwhile; the
clock is only read, never set) and prints the tensor cores' dense peak at
that clock: SMs x FLOP per clock per SM x clock (sm_90: 4096 = 989.4 TFLOPS /
(132 SMs x 1830 MHz), the H100 SXM5 whitepaper's dense fp16 figure; sm_80:
2048). No kernel of any kind can exceed that peak.

Run: python3 scripts/gemm_ceiling.py [--D 1024 512]   (gpu_check.sh runs it after the D = 1024 benchmarks)
"""
import argparse
import shutil
import statistics
import subprocess
import time

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


# Dense fp16/bf16 tensor-core FLOPs per clock per SM, by compute capability.
DENSE_FLOP_PER_CLOCK_PER_SM = {(8, 0): 2048, (9, 0): 4096}


def sustained_clock(fn, seconds=1.0):
    """Runs fn back to back for `seconds` while nvidia-smi samples the SM clock
    and the power every 50 ms; returns (median MHz, median W, samples) or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    index = torch.cuda.current_device()
    proc = subprocess.Popen([smi, "-i", str(index), "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        fn()  # already warm: median_ms ran it
        torch.cuda.synchronize()
        t_end = time.time() + seconds
        while time.time() < t_end:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    mhz, watts = [], []
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        try:
            mhz.append(float(parts[0]))
            watts.append(float(parts[1]))
        except (ValueError, IndexError):
            continue
    # The first samples may predate the load: keep the second half.
    mhz, watts = mhz[len(mhz) // 2:], watts[len(watts) // 2:]
    if not mhz:
        return None
    return statistics.median(mhz), statistics.median(watts), len(mhz)


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
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    per_clock = DENSE_FLOP_PER_CLOCK_PER_SM.get((props.major, props.minor))
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
        target = 2 * attn_flops / t_unfused / 1e9
        print(f"D = {D}: torch(unfused) {t_unfused:.3f} ms ({attn_flops / t_unfused / 1e9:.1f} TFLOPS); "
              f"the two GEMMs alone reach {t_unfused / (t_qk + t_pv):.2f}x torch(unfused); 2x would need "
              f"{target:.1f} TFLOPS")
        clock = sustained_clock(lambda: (torch.bmm(q, kt, out=s), torch.bmm(p, v, out=o)))
        if clock is None:
            print(f"D = {D}: sustained clock not measured (no nvidia-smi, or it printed nothing)")
        elif per_clock is None:
            print(f"D = {D}: SM clock under the two GEMMs {clock[0]:.0f} MHz, {clock[1]:.0f} W "
                  f"(median of {clock[2]} samples); no dense peak known for sm_{props.major}{props.minor}")
        else:
            peak = props.multi_processor_count * per_clock * clock[0] * 1e6 / 1e12
            print(f"D = {D}: SM clock under the two GEMMs {clock[0]:.0f} MHz, {clock[1]:.0f} W (median of "
                  f"{clock[2]} samples); dense tensor-core peak at that clock {props.multi_processor_count} SMs x "
                  f"{per_clock} FLOP x {clock[0]:.0f} MHz = {peak:.1f} TFLOPS; the GEMMs alone reach "
                  f"{attn_flops / (t_qk + t_pv) / 1e9 / peak:.2f} of it, 2x torch(unfused) would need "
                  f"{target / peak:.2f}")
        del q, k, v, s, o, p, kt


if __name__ == "__main__":
    main()
