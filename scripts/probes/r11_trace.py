#!/usr/bin/env python3
"""Adds clock() tracing to a copy of rung 11's pass 1 (a probe, never committed
into the kernel): per run of steps (A: both accumulators' MMAs, B:
accumulator 1's epilogue, C: both, D: accumulator 0's epilogue) the cycles a
step spends waiting for its slot, issuing its MMAs, retiring step s - kInFlight
(commit + wgmma_wait), and in
the epilogue part; the drains; printed by thread 0 of each warpgroup of block 0.
It edits the pass 1 of scripts/probes/next_rung11_staggered.patch (apply that
first; session21_c ran an earlier form of this script on probe b's version, whose
steps retired with a plain wgmma_wait<1>); the landed pass 1 has no runs of steps.
Usage: r11_trace.py SRC DST"""
import sys

src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()


def sub(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)


sub('''  auto mma_step = [&](int s, auto&&... mmas) {
    ring.wait(s);
    wgmma_fence();
    (mmas(), ...);
    retire_previous(s);
  };''', '''  unsigned tr[4][4] = {}, tr_n[4] = {}, tr_drain = 0;
  const unsigned tr_start = clock();
  auto mma_step = [&](int region, int s, auto&&... mmas) {
    const unsigned c0 = clock();
    ring.wait(s);
    const unsigned c1 = clock();
    wgmma_fence();
    (mmas(), ...);
    const unsigned c2 = clock();
    retire_previous(s);
    const unsigned c3 = clock();
    tr[region][0] += c1 - c0;
    tr[region][1] += c2 - c1;
    tr[region][2] += c3 - c2;
    tr_n[region] += 1;
  };''')
sub('mma_step(s, [&] { issue_mmas(S0, s, 0, u); }, [&] { issue_mmas(S1, s, 1, u - o1 + period); });',
    'mma_step(0, s, [&] { issue_mmas(S0, s, 0, u); }, [&] { issue_mmas(S1, s, 1, u - o1 + period); });')
sub('''      mma_step(s, [&] { issue_mmas(S0, s, 0, u); });
      if (i > 0) epilogue_part(S1, 2 * i - 1, u - (o1 - k));''', '''      mma_step(1, s, [&] { issue_mmas(S0, s, 0, u); });
      const unsigned e0 = clock();
      if (i > 0) epilogue_part(S1, 2 * i - 1, u - (o1 - k));
      tr[1][3] += clock() - e0;''')
sub('mma_step(s, [&] { issue_mmas(S0, s, 0, u); }, [&] { issue_mmas(S1, s, 1, u - o1); });',
    'mma_step(2, s, [&] { issue_mmas(S0, s, 0, u); }, [&] { issue_mmas(S1, s, 1, u - o1); });')
sub('''      mma_step(s, [&] { issue_mmas(S1, s, 1, u - o1); });
      epilogue_part(S0, 2 * i, u - d);''', '''      mma_step(3, s, [&] { issue_mmas(S1, s, 1, u - o1); });
      const unsigned e0 = clock();
      epilogue_part(S0, 2 * i, u - d);
      tr[3][3] += clock() - e0;''')
sub('''    wgmma_wait<0>();  // see below
''', '''    { const unsigned c = clock(); wgmma_wait<0>(); tr_drain += clock() - c; }
''')
sub('''    wgmma_wait<0>();
    for (int u = d; u < period; ++u, ++s) {''', '''    { const unsigned c = clock(); wgmma_wait<0>(); tr_drain += clock() - c; }
    for (int u = d; u < period; ++u, ++s) {''')
sub('''  wgmma_wait<0>();
  for (int r = max(0, sched.steps - Cfg::kInFlight); r < sched.steps; ++r) ring.release(r);''', '''  wgmma_wait<0>();
  for (int r = max(0, sched.steps - Cfg::kInFlight); r < sched.steps; ++r) ring.release(r);
  if (blockIdx.x == 0 && threadIdx.x % 128 == 0) {  // printed by a kernel of its own (a call here serialises wgmma)
    unsigned* g = g_trace[warpgroup];
    g[0] = clock() - tr_start;
    g[1] = sched.steps;
    g[2] = tr_drain;
    for (int r = 0; r < 4; ++r) {
      g[3 + 5 * r] = tr_n[r];
      for (int j = 0; j < 4; ++j) g[4 + 5 * r + j] = tr[r][j] / max(tr_n[r], 1u);
    }
  }''')
sub('''// ---- pass 1: S = Q·Kᵀ per 128-key tile''', '''__device__ unsigned g_trace[2][24];
__global__ void print_trace_kernel() {
  for (int w = 0; w < 2; ++w) {
    const unsigned* g = g_trace[w];
    printf("trace wg%d: loop %u cycles, %u steps, drains %u\\n", w, g[0], g[1], g[2]);
    for (int r = 0; r < 4; ++r)
      printf("trace wg%d run %c: %u steps; per step: slot wait %u, issue %u, retire %u, epilogue %u\\n", w, 'A' + r,
             g[3 + 5 * r], g[4 + 5 * r], g[5 + 5 * r], g[6 + 5 * r], g[7 + 5 * r]);
  }
}

// ---- pass 1: S = Q·Kᵀ per 128-key tile''')
sub('''      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;''', '''      if (err != cudaSuccess) return err;
    }
    print_trace_kernel<<<1, 1, 0, stream>>>();
    return cudaSuccess;''')
s = s.replace('#include <cuda_bf16.h>', '#include <cstdio>\n#include <cuda_bf16.h>', 1)
open(dst, 'w').write(s)
