"""The Python benchmarks' timer: the harness's (bench/runner.cpp, time_calls_interleaved) in torch.

Each call is warmed up, then timed in rounds over all calls, so that every
call meets the same clocks; in each round, before each call, the L2 is flushed
(a 256 MiB buffer zeroed, more than any Hopper L2) and a GPU delay is queued
(torch.cuda._sleep, as the harness's host/gpu_delay.h: the call's host-side
dispatch, Python and torch.compile's guards included, is queued while the GPU
is still busy, so the CUDA events around the call measure GPU time alone). The
median of each call's times is its time. Needs torch and a GPU: only the
benchmarks import it, after they have found both.
"""
import statistics

from run_info import first_line

FLUSH_BYTES = 256 << 20
DELAY_CYCLES = 600_000  # torch.cuda._sleep's spin before each timed call: 300 µs at 2 GHz, longer at lower clocks


class Timer:
    def __init__(self, torch, device):
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)

    def time_interleaved(self, calls, warmup, iters):
        """([median ms or None], [error or '']) of `calls`. A call is a function, or (prepare, timed):
        prepare() runs untimed and its result goes to timed (a backward's forward graph). A call that
        raises, in its warm-up or a round, is not timed again; its error is the exception's first line."""
        torch = self.torch
        calls = [c if isinstance(c, tuple) else (lambda: None, lambda _, c=c: c()) for c in calls]
        errors = [""] * len(calls)
        for i, (prepare, timed) in enumerate(calls):
            try:
                for _ in range(warmup):
                    timed(prepare())
                torch.cuda.synchronize()
            except Exception as e:  # a library's refusal or failure is the row's, not the run's
                errors[i] = first_line(e) or type(e).__name__
        times = [[] for _ in calls]
        for _ in range(iters):
            for i, (prepare, timed) in enumerate(calls):
                if errors[i]:
                    continue
                try:
                    arg = prepare()
                    self.flush.zero_()
                    torch.cuda._sleep(DELAY_CYCLES)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    timed(arg)
                    end.record()
                    end.synchronize()
                    times[i].append(start.elapsed_time(end))
                except Exception as e:
                    errors[i] = first_line(e) or type(e).__name__
        medians = [statistics.median(t) if t and not e else None for t, e in zip(times, errors)]
        return medians, errors
