#!/usr/bin/env bash
# The GPU machine's checks, in steps that each fit one 10-minute device call
# (each with a cold build; bwd builds the harness alone, blocksparse the Python module):
#   scripts/gpu_check.sh check   # build; the CPU and GPU tests; compute-sanitizer
#                                # (memcheck, racecheck, synccheck) on ragged shapes;
#                                # checks against torch's fp32 SDPA; the Python package
#                                # installed by pip and tested from outside the tree
#   scripts/gpu_check.sh bench   # build; the benchmark set (bench.csv, dmattn.csv), the
#                                # GEMM ceiling, variable-length and paged-decode rows
#                                # beside their peers (varlen.csv, scripts/bench_varlen.py),
#                                # ncu's bank conflicts and one profile per main-path step
#                                # (ncu_steps.csv); in results/<gpu>/ also every table and
#                                # plot regenerated from the CSVs
#   scripts/gpu_check.sh bwd     # build; the dense backward's benchmark set (bwd.csv),
#                                # checked, and the GEMM ceiling; no ncu; in results/<gpu>/
#                                # also every table regenerated
#   scripts/gpu_check.sh blocksparse  # build; the block-sparse fuzz tester against torch's
#                                # flex_attention (blocksparse_fuzz.txt) and the benchmark
#                                # against compiled flex_attention (blocksparse.csv)
#   scripts/gpu_check.sh peers   # no build; FlashAttention-4 (scripts/bench_peers.py) on the
#                                # bench and bwd sets alone, its rows appended to bench.csv
#                                # and bwd.csv (bench and bwd also run it, after the harness)
# All build in build-gpu, so a later step reuses the first one's build.
# Output: $OUT when set (the device tool's folder, which returns at most eight
# files), else results/<gpu>/: check writes tests.txt, sanitizer_summary.txt,
# reference_torch.txt, sass_mma.txt; bench writes mission.txt (the harness
# at B=1 H=8 N=8192 D=512), bench.csv, bench.txt, dmattn.csv, varlen.csv,
# gemm_ceiling.txt, ncu_bank_conflicts.txt (and fwd.csv with SWEEP=1); bwd writes bwd.csv,
# bwd.txt, gemm_ceiling_bwd.txt; blocksparse writes blocksparse_fuzz.txt,
# blocksparse.csv, blocksparse.txt. Each writes summary.md (scripts/gpu_summary.sh),
# printed last, and logs.tar.gz with every other log, and exits 0 only when
# everything it ran passed (bwd: every harness run, no row FAIL). bench and bwd
# also print how far each peer moved against the committed CSV they replace
# (scripts/peer_drift.py): a ratio to a peer that moved is the peer's. bench
# and bwd then run FlashAttention-4 on their set (scripts/bench_peers.py:
# rows fa4 and fa4 bwd, appended to bench.csv and bwd.csv, its output to
# bench.txt and bwd.txt); without flash-attn-4 installed that is one line
# saying so. bench then runs scripts/bench_varlen.py (attnlab's varlen forward and
# backward and its paged decode, not yet run on a GPU: --unverified, the rows
# marked; beside FlashAttention-4, SDPA on nested tensors, compiled flex_attention,
# FlashInfer and a copy's bandwidth), its rows to varlen.csv, its output to
# logs/varlen.txt. summary.md names the software (scripts/run_info.py: torch,
# cuDNN, CUDA, driver, flash-attn-4, CUTLASS DSL).
# Switches (environment): CUDA_ARCH=90a, BUILD_DIR=build-gpu, QUICK=1 (check: no
# sanitizers; bench: no causal, bf16 or large shapes, bench_varlen.py --quick; bwd:
# the B=1 H=8 shapes only), SANITIZER=0, SANITIZER_STREAMS=6 (runs at once), CHECK_BUDGET=540
# (check: the seconds after which nothing runs on), PEER_WHEELS=DIR (bench, bwd,
# blocksparse, peers: the peers' wheels installed first, scripts/peer_wheels.sh), BWD_BUDGET=540 (bwd: the
# same; GQA=1: also its two GQA shapes), ONLY='wgmma*' or 'bwd-ws*' (GPU variant tests of the matching variants
# only: test_gpu_variants and test_gpu_bwd_variants each run when ONLY names
# one of their variants), DMATTN=0 (no dynamic-mask tests or benchmarks;
# DMATTN_L="1024 8192"), SKIP_TORCH_REF=1, PIP=0 (tests/python on build/python
# instead of the installed package), NCU=0, SWEEP=1 (bench: also scripts/sweep;
# SWEEP_ARGS="--iters 5", SWEEP_TIMEOUT=400 seconds), BLOCKSPARSE_PART=fuzz or
# bench (blocksparse: that step alone; with a cold build both take about 10
# minutes), BLOCKSPARSE_BUDGET=540, PEERS=0 (bench, bwd: no FlashAttention-4
# rows; bench: no peer rows in varlen.csv), PEERS_BUDGET=240 (bench, bwd, peers:
# its seconds per set; shapes left at the end are listed as not run),
# VARLEN_BUDGET=200 (bench: bench_varlen.py's seconds; the cases it had no time
# for are listed as not run).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:-}
case "$mode" in
  check | bench | bwd | blocksparse | peers) ;;
  *) echo "usage: scripts/gpu_check.sh check|bench|bwd|blocksparse|peers" >&2; exit 2 ;;
esac
build=${BUILD_DIR:-build-gpu}
arch=${CUDA_ARCH:-90a}
export ATTNLAB_COMMIT=${ATTNLAB_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}

slug=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
       sed 's/^NVIDIA //; s/^GeForce //; s/[^A-Za-z0-9.]\+/-/g; s/-$//')
out=${OUT:-results/${slug:-unknown-gpu}}
logs="$out/logs"  # everything but the headline files; packed into logs.tar.gz at the end
rm -rf "$logs" "$out/logs.tar.gz"
mkdir -p "$logs"

step() { printf '\n=== [%d s] %s\n' "$SECONDS" "$*"; }
# finish STATUS: the summary, the logs packed, exit STATUS.
finish() {
  step "summary -> $out/summary.md"
  TORCH_VERSION="$torch_version" CUDA_ARCH="$arch" SUMMARY_NOTE="${SUMMARY_NOTE:-}" \
    SOFTWARE="$(python3 scripts/run_info.py 2>/dev/null)" scripts/gpu_summary.sh "$out" > "$out/summary.md"
  tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
  cat "$out/summary.md"
  exit "$1"
}
# regenerate_tables WHAT : the tables and plots regenerated from results/<gpu>/
# (ok=1 if that fails), or, when the results went to $OUT, how to do it there.
regenerate_tables() {
  if [ -z "${OUT:-}" ]; then
    step "tables and plots regenerated from the CSVs"
    python3 scripts/regenerate.py || ok=1
  else
    step "to regenerate the tables and plots: copy $1 into results/${slug:-<gpu>}/, then python3 scripts/regenerate.py"
  fi
}
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
# keep_previous NAME : the committed results/<gpu>/NAME as it was before this run
# (it may be the file this run rewrites), for peer_drift below.
keep_previous() { cp "results/${slug:-unknown-gpu}/$1" "$logs/$1.before" 2>/dev/null || true; }
# peer_drift CSV : how far each peer moved against the committed run of the same
# set (scripts/peer_drift.py): a ratio to a peer that moved reflects the peer.
peer_drift() {
  [ -s "$logs/$(basename "$1").before" ] && [ -s "$1" ] || return 0
  step "peers against the committed $(basename "$1") (scripts/peer_drift.py)"
  python3 scripts/peer_drift.py "$logs/$(basename "$1").before" "$1" | tee "$logs/peer_drift_$(basename "$1" .csv).txt"
}

# ---- the benchmark sets: the harness's options per shape ------------------------------
# bench_set: the forward set (bench.csv), in its order; "@gemm_ceiling" marks where
# the GEMM ceiling is measured, "--no-check" a shape timed only. bwd_set: the dense
# backward's (bwd.csv). The harness runs them (bench, bwd) and so does
# FlashAttention-4 (run_peers: bench, bwd and peers).
bench_set=()
for D in 64 128 256; do
  bench_set+=("--B 1 --H 8 --N 8192 --D $D")
  [ -n "${QUICK:-}" ] || bench_set+=("--B 1 --H 8 --N 8192 --D $D --causal")
done
if [ -z "${QUICK:-}" ]; then
  bench_set+=("--B 1 --H 8 --N 8192 --D 64 --dtype bf16"
              "--B 1 --H 8 --N 8192 --D 512" "--B 1 --H 8 --N 8192 --D 1024" "--B 1 --H 8 --N 8192 --D 1024 --causal"
              # The ceiling at D = 1024: cuBLAS's two GEMMs alone, against torch's
              # unfused path, on the card as it is right after those runs (docs/11_two_pass.md).
              "@gemm_ceiling"
              "--B 4 --H 16 --N 4096 --D 128" "--B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal"
              "--B 1 --H 32 --Hkv 8 --N 8192 --D 128" "--B 1 --H 32 --Hkv 8 --N 8192 --D 128 --causal"  # GQA
              "--B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16"  # DeepSeek V3's prefill (MLA)
              "--B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16 --causal"
              "--B 1 --H 8 --Nq 1000 --Nk 8192 --D 128 --causal"
              "--no-check --B 1 --H 48 --N 16384 --D 512")  # large: the fp32 reference alone would take minutes
fi
bwd_set=()
for D in 64 128 256; do
  bwd_set+=("--B 1 --H 8 --N 8192 --D $D" "--B 1 --H 8 --N 8192 --D $D --causal")
done
if [ -z "${QUICK:-}" ]; then
  bwd_set+=("--B 4 --H 16 --N 4096 --D 128 --dtype bf16 --causal"
            "--B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16"  # DeepSeek V3's prefill (MLA)
            "--B 2 --H 16 --N 4096 --D 192 --Dv 128 --dtype bf16 --causal")
fi
# GQA=1: also B = 1 H = 32 Hkv = 8 (its fp32 reference backward alone takes about a minute a shape).
[ -z "${GQA:-}" ] || bwd_set+=("--B 1 --H 32 --Hkv 8 --N 8192 --D 128" "--B 1 --H 32 --Hkv 8 --N 8192 --D 128 --causal")

# run_peers CSV LOG SECONDS [--bwd] : FlashAttention-4's rows (scripts/bench_peers.py) on
# bench_set (--bwd: bwd_set), appended to CSV, its output to LOG and its rows' lines
# here; within SECONDS (the shapes it had no time for listed as not run). Without
# flash-attn-4 installed: one line, no failure. A row that FAILED fails the step, as
# a harness row does; PEERS=0: not run.
run_peers() {
  local rows=$1 log=$2 seconds=$3 s rc
  shift 3
  [ "${PEERS:-1}" != 0 ] || { echo "FlashAttention-4: not run (PEERS=0)"; return 0; }
  local shapes=("${bench_set[@]}") shape_args=()
  [ "${1:-}" = --bwd ] && shapes=("${bwd_set[@]}")
  for s in "${shapes[@]}"; do [[ $s == @* ]] || shape_args+=(--shape "$s"); done
  step "FlashAttention-4 on the set (scripts/bench_peers.py${1:+ $1}) into $(basename "$rows")"
  printf '\n==== scripts/bench_peers.py%s\n' "${1:+ $1}" >> "$log"
  timeout "$seconds" python3 scripts/bench_peers.py "$@" --csv "$rows" --budget $((seconds > 150 ? seconds - 90 : 60)) \
    "${shape_args[@]}" 2>&1 | tee -a "$log" | grep -E '^fa4|^ +fa4|^not run|rows ->|^bench_peers'
  rc=${PIPESTATUS[0]}
  case $rc in
    0) ;;
    124) echo "FlashAttention-4: cut at $seconds s (scripts/gpu_check.sh peers runs it alone)" | tee -a "$log" ;;
    *) echo "bench_peers.py: exit $rc" | tee -a "$log"; ok=1 ;;
  esac
}

# The peers' wheels carried to a machine without the package index (PEER_WHEELS=DIR, as
# scripts/peer_wheels.sh fetch wrote it): installed first, by any step that runs the peers.
if [ -n "${PEER_WHEELS:-}" ] && [ "$mode" != check ] && [ "${PEERS:-1}" != 0 ]; then
  step "the peers' wheels from $PEER_WHEELS (scripts/peer_wheels.sh install)"
  scripts/peer_wheels.sh install "$PEER_WHEELS" 2>&1 | tail -3
fi

# FlashAttention-4 alone: no build (bench_peers.py needs torch and flash-attn-4, not this tree's build).
if [ "$mode" = peers ]; then
  ok=0
  run_peers "$out/bench.csv" "$out/bench.txt" "${PEERS_BUDGET:-240}"
  run_peers "$out/bwd.csv" "$out/bwd.txt" "${PEERS_BUDGET:-240}" --bwd
  if [ -z "${OUT:-}" ]; then
    regenerate_tables "bench.csv and bwd.csv"
  else
    step "to regenerate the tables: append the rows of bench.csv and bwd.csv (not their header line) to results/${slug:-<gpu>}/'s, then python3 scripts/regenerate.py"
  fi
  finish $ok
fi

# ---- configure + build (both steps) ------------------------------------------------
# Ninja when there is one; exported, so that pip (scikit-build-core) configures
# the same build folder with the same generator and finds everything built.
export CMAKE_GENERATOR=${CMAKE_GENERATOR:-$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")}
if [ -f "$build/CMakeCache.txt" ] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$CMAKE_GENERATOR" "$build/CMakeCache.txt"; then
  rm -rf "$build"  # configured by another generator
fi
cmake_defs=(-DCMAKE_CUDA_ARCHITECTURES="$arch" -DATTNLAB_PTXAS_VERBOSE=ON -DATTNLAB_BUILD_TESTS=ON)
# blocksparse's steps are Python's alone: the module, not every kernel's test (a minute less);
# bwd's are the harness's alone.
build_targets=()
[ "$mode" = blocksparse ] && build_targets=(--target attnlab_python)
[ "$mode" = bwd ] && build_targets=(--target flash_attn_mma)
step "configure + build (sm_$arch, $(nproc) jobs${build_targets[*]:+, ${build_targets[*]}})"
# With PyTorch when the python3 on PATH has it; without, if its CMake config fails.
# (-U: the wheel's paths that a pip build left in the cache.)
{ cmake -S . -B "$build" -U 'SKBUILD*' "${cmake_defs[@]}" ||
  { echo "configure with torch failed; retrying without"; rm -rf "$build";
    cmake -S . -B "$build" "${cmake_defs[@]}" -DATTNLAB_WITH_TORCH=OFF; } &&
  cmake --build "$build" -j "$(nproc)" "${build_targets[@]}"; } > "$logs/build.log" 2>&1
build_rc=$?
grep -E "attnlab:|error|retrying" "$logs/build.log" | head -20
echo "ptxas spill warnings not in results/ptxas_spills.csv: $(grep -c 'Registers are spilled' "$logs/build.log")"
# ptxas's advisories that it serialised a kernel's wgmmas or waited for them
# where the code does not (C7510-C7517): every wgmma then waits for the last.
echo "ptxas wgmma serialisation advisories: $(grep -c '(C751[0-9])' "$logs/build.log")"
if [ $build_rc -ne 0 ]; then
  tail -30 "$logs/build.log"
  SUMMARY_NOTE="The build FAILED: logs/build.log in logs.tar.gz; nothing else ran." finish 1
fi

build_abs=$(cd "$build" && pwd)
# limit SECONDS: a run's timeout, SECONDS or what is left of the step's budget
# (check, bwd: set below), at least 1.
limit() { local left=$((budget - SECONDS)); echo $((left < $1 ? (left > 1 ? left : 1) : $1)); }

if [ "$mode" = check ]; then
  # ---- check: everything at once ------------------------------------------------------
  # The tests, the sanitizers and the other checks judge correctness only, so
  # they share the GPU and the CPU cores; the benchmarks (bench) run alone.
  # No run goes on past CHECK_BUDGET seconds (a cut run fails), and a
  # sanitizer run that would start in the last 40 seconds is reported as not
  # run, so the step ends within one device call.
  ok=0
  pids=()
  budget=${CHECK_BUDGET:-540}

  # sanitize LOG TOOL ARGS : one checked run of the harness under compute-sanitizer
  # (B=1 H=2 unless ARGS say; its output appended to LOG); prints one line: the
  # exit status and the tool's summary, and a warning where a dynamic-mask
  # run's mask left no tile to compute.
  sanitize() {
    local log=$1 tool=$2 args=$3 rc batch=() cmd
    if [[ $args == @* ]]; then  # "@TEST --only TEXT": the cases of a GPU test named TEXT
      local test=${args%% *}
      cmd=("$build/${test#@}" --only "${args#* --only }")
    else
      [[ " $args " == *" --B "* ]] || batch+=(--B 1)
      [[ " $args " == *" --H "* ]] || batch+=(--H 2)
      cmd=("$build/flash_attn_mma" "${batch[@]}" $args --iters 1 --warmup 0 --check --no-peers)
    fi
    echo "== $tool $args" >> "$log"
    timeout "$(limit 100)" compute-sanitizer --tool "$tool" --error-exitcode 9 "${cmd[@]}" >> "$log.run" 2>&1
    rc=$?
    cat "$log.run" >> "$log"
    echo "$tool $args: rc=$rc $(grep -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' "$log.run" | tail -1 | sed 's/^=* *//')$(
      grep -q 'tiles skipped 100.0%' "$log.run" && echo ' (EMPTY MASK: only the fully-masked path ran)')"
    rm -f "$log.run"
  }
  # The shapes: the rungs (every variant runs; --show-all prints each), the
  # dense backward's rungs (--bwd: every backward variant), then
  # dynamic-mask attention: forward with a forced split count, and the
  # backward. The top-W masks are block-smoothed by majority (--block 64)
  # unless --block 0: W must be about Nk/2 for some key blocks to survive
  # (with W <= Nk/10 the mask is all zeros and only the fully-masked path
  # runs). A run whose mask is empty says so. A job "@TEST --only TEXT" runs
  # the cases of a GPU test whose names hold TEXT instead of the harness.
  rung_shapes=("--Nq 129 --Nk 77 --D 64 --causal" "--Nq 17 --Nk 200 --D 256 --dtype bf16"
               "--Nq 70 --Nk 130 --D 512 --causal" "--Nq 70 --Nk 130 --D 1024 --causal"
               "--Nq 256 --Nk 300 --D 256 --causal --variant two-pass+stage4"
               "--Nq 77 --Nk 129 --D 128 --variant minimal"
               "--H 4 --Hkv 2 --Nq 130 --Nk 300 --D 128 --causal" "--H 4 --Hkv 1 --Nq 300 --Nk 130 --D 192 --Dv 128 --causal"
               "--H 4 --Hkv 2 --Nq 300 --Nk 1000 --D 64")  # the last: rung 12's keys split over blocks
  bwd_shapes=("--B 2 --H 4 --Hkv 2 --Nq 257 --Nk 383 --D 64 --causal" "--H 4 --Hkv 1 --Nq 383 --Nk 257 --D 128 --dtype bf16"
              "--H 4 --Hkv 2 --Nq 150 --Nk 221 --D 256 --causal")
  # Block-sparse (--mask-mod), forward and backward on three ragged shapes: partial
  # and full blocks, rows and keys that see nothing, GQA, 256 x 256 blocks.
  blocksparse_shapes=("--H 4 --Hkv 2 --Nq 300 --Nk 1000 --D 128 --mask-mod causal --score-mod alibi"
                      "--H 4 --Hkv 1 --Nq 777 --Nk 555 --D 64 --mask-mod sliding_window:100,20 --score-mod softcap:20"
                      "--B 2 --H 2 --Nq 513 --Nk 513 --D 192 --Dv 128 --dtype bf16 --mask-mod document:3 --block-size 256,256")
  # The tensor mods (a keep mask, a bias), which the harness has no tensors for:
  # cases of the block-sparse tests, forward (a bias [1, H, 1, Nk] loaded ahead;
  # a mask and a bias [1, H, 1, 17] element-wise) and backward (D = 256; D = 64 GQA).
  tensor_mod_cases=("@test_blocksparse_fwd --only causal + bias, 1000x300"
                    "@test_blocksparse_fwd --only tensor + bias, 17x17"
                    "@test_blocksparse_bwd --only tensor + bias, 333x455"
                    "@test_blocksparse_bwd --only sliding_window:64,32 + bias, 520x130")
  # The variable-length forward and backward on a packed batch with empty
  # sequences and keys apart from queries (the prepare kernels included), and
  # paged decoding with rows that see no key.
  varlen_cases=("@test_varlen --only lengths 0,5,0,300 H=3"
                "@test_varlen --only lengths 17/40,300/299,1/0,64/1 H=4"
                "@test_varlen --only bwd lengths 17/40"
                "@test_paged_decode --only lengths 3,2,0 Nq=8")
  dmattn_shapes=("--Nq 1 --Nk 3000 --D 128 --Hkv 1 --mask topk --window 64 --block 0 --bias --splits 4"
                 "--Nq 1 --Nk 20000 --D 256 --mask topk --window 3000 --block 0 --bias --softcap 20 --splits 1"
                 "--Nq 70 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 64 --bias --bwd"
                 "--B 2 --Nq 130 --Nk 77 --D 128 --mask topk --window 16 --block 0 --bias --deterministic"
                 "--Nq 130 --Nk 300 --D 128 --causal --mask topk --window 150 --bias"
                 "--Nq 130 --Nk 301 --D 64 --mask topk --window 64 --block 0 --bias --dma-core wgmma-cp.async"
                 "--Nq 200 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 64 --bias --bwd-chunks 3"
                 "--Nq 200 --Nk 1000 --D 128 --Hkv 1 --causal --mask topk --window 500 --bias --dma-mask-scan in-kernel"
                 "--Nq 130 --Nk 2333 --D 64 --mask topk --window 1166 --bias --dma-mask-scan prepass"
                 "--Nq 600 --Nk 800 --D 64 --Hkv 1 --causal --mask topk --window 400 --bias --dma-mask-scan pipelined --dma-prepass-chunks 5 --mask-bits"
                 "--Nq 130 --Nk 300 --D 128 --causal --mask topk --window 150 --bias --bwd --mask-bits")
  [ "${DMATTN:-1}" != 0 ] || dmattn_shapes=()
  san_jobs=()  # "TOOL|ARGS", shape by shape
  for shape in "${rung_shapes[@]/%/ --show-all}" "${bwd_shapes[@]/%/ --bwd --show-all}" "${dmattn_shapes[@]}" \
               "${blocksparse_shapes[@]}" "${blocksparse_shapes[@]/%/ --bwd}" "${tensor_mod_cases[@]}" "${varlen_cases[@]}"; do
    for tool in memcheck racecheck synccheck; do san_jobs+=("$tool|$shape"); done
  done
  # run_sanitizer_stream K : takes the next job not yet taken (a counter under
  # a lock), until none is left; each job's line into logs/sanitizer/JOB.txt.
  next_job() {
    flock "$logs/sanitizer/next" bash -c 'n=$(cat "$1"); echo $((n + 1)) > "$1"; echo "$n"' _ "$logs/sanitizer/next"
  }
  run_sanitizer_stream() {
    local k=$1 j
    while j=$(next_job) && ((j < ${#san_jobs[@]})); do
      local tool=${san_jobs[j]%%|*} args=${san_jobs[j]#*|}
      if ((budget - SECONDS < 40)); then
        echo "$tool $args: NOT RUN (past the step's time budget)"
      else
        sanitize "$logs/sanitizer/stream$k.log" "$tool" "$args"
      fi > "$logs/sanitizer/$(printf %03d "$j").txt"
    done
  }
  # The Python package: built by pip from the same build folder (configured
  # alike, so nothing is compiled again), installed into a folder of its own,
  # imported and tested from outside the source tree. The install runs first,
  # alone: pip's configure relinks the build folder's programs, which must not
  # happen while the tests below run them.
  site=$build_abs/python
  python_install() {
    [ "${PIP:-1}" != 0 ] || return 0
    site=$build_abs/pip-site
    rm -rf "$site"
    local -a defines=()
    for d in "${cmake_defs[@]}"; do defines+=(-C "cmake.define.${d#-D}"); done
    timeout "$(limit 300)" python3 -m pip install --no-build-isolation --no-deps --target "$site" \
      -C build-dir="$build_abs" "${defines[@]}" . > "$logs/pip_install.log" 2>&1 && return 0
    echo "pip install: FAILED (logs/pip_install.log)" > "$logs/python.rc"
    return 1
  }
  python_tests() {
    local where
    where=$(cd /tmp && PYTHONPATH="$site" python3 -c "import attnlab; print(attnlab.__file__)" 2>> "$logs/python.log")
    if [[ "$where" != "$site/"* ]]; then
      echo "import attnlab: FAILED (found '${where:-nothing}', not under $site; logs/python.log)" > "$logs/python.rc"
      return
    fi
    (cd /tmp && PYTHONPATH="$site" timeout "$(limit 300)" python3 -m pytest -q -p no:cacheprovider "$root/tests/python") \
      >> "$logs/python.log" 2>&1
    local rc=$?
    echo "tests/python on $([ "${PIP:-1}" != 0 ] && echo "the pip-installed package" || echo build/python):" \
      "$(grep -E '^[0-9]+ (passed|failed)|^Exit:' "$logs/python.log" | tail -1)$([ $rc -eq 0 ] || echo " FAILED (exit $rc)")" \
      > "$logs/python.rc"
    [ "${PIP:-1}" = 0 ] || echo "harness installed by pip: $("$site/bin/flash_attn_mma" --list > /dev/null 2>&1 &&
      echo "runs" || echo "FAILED to run")" >> "$logs/python.rc"
  }
  step "the Python package: pip install"
  python_install && { python_tests & pids+=($!); }

  sanitizers=0
  if [ -z "${QUICK:-}" ] && [ "${SANITIZER:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
    sanitizers=1
    streams=${SANITIZER_STREAMS:-6}
    step "compute-sanitizer: ${#san_jobs[@]} runs (memcheck, racecheck, synccheck), $streams at once, in the background"
    mkdir -p "$logs/sanitizer"
    echo 0 > "$logs/sanitizer/next"
    for ((k = 0; k < streams; ++k)); do run_sanitizer_stream $k & pids+=($!); done
  fi

  step "GPU tests, in the background"
  # gpu_test EXE SECONDS [ARGS] : one GPU test program under a timeout, its
  # output in logs/EXE.log, one status line in logs/EXE.rc.
  gpu_test() {
    local exe=$1 limit=$2 rc
    shift 2
    timeout "$(limit "$limit")" "$build/$exe" "$@" > "$logs/$exe.log" 2>&1
    rc=$?
    echo "$exe: $(tail -1 "$logs/$exe.log")$([ $rc -eq 0 ] || echo " (exit $rc$([ $rc -eq 124 ] && echo ': timed out'))")" \
      > "$logs/$exe.rc"
  }
  # The variant tests, forward and dense backward, each of the variants ONLY
  # names (every one without ONLY); a program ONLY names none of is not run.
  names_any() { [ -z "${ONLY:-}" ] || [ -n "$("$build/flash_attn_mma" --list --no-peers --variant "$ONLY" "$@" 2>/dev/null)" ]; }
  gpu_tests=()
  names_any && gpu_tests+=(test_gpu_variants)
  names_any --bwd && gpu_tests+=(test_gpu_bwd_variants)
  for t in "${gpu_tests[@]}"; do gpu_test "$t" 300 "${ONLY:-*}" & pids+=($!); done
  if [ ${#gpu_tests[@]} -eq 0 ]; then
    echo "ONLY='$ONLY': names no variant: no variant test ran" > "$logs/only.rc"
    gpu_tests+=(only)
  fi
  if [ "${DMATTN:-1}" != 0 ]; then
    dmattn_tests=(test_dmattn test_dmattn_backward test_dmattn_reference test_dmattn_summary test_dmattn_backward_reference)
    for t in "${dmattn_tests[@]}"; do gpu_test "$t" 400 & pids+=($!); done
    gpu_tests+=("${dmattn_tests[@]}")
  fi
  gpu_test test_block_mask_gpu 120 & pids+=($!)  # the block-sparse family's GPU block masks
  gpu_tests+=(test_block_mask_gpu)
  gpu_test test_blocksparse_fwd 180 & pids+=($!)  # the block-sparse forward against CPU references
  gpu_tests+=(test_blocksparse_fwd)
  gpu_test test_blocksparse_bwd 180 & pids+=($!)  # the block-sparse backward against CPU references
  gpu_tests+=(test_blocksparse_bwd)
  gpu_test test_mods_reference 120 & pids+=($!)  # the mask_mod/score_mod GPU reference (flash_attn_mma --mask-mod's check)
  gpu_tests+=(test_mods_reference)
  gpu_test test_varlen 240 & pids+=($!)  # the variable-length forward and backward against references per sequence
  gpu_tests+=(test_varlen)
  gpu_test test_paged_decode 240 & pids+=($!)  # paged-KV decoding against CPU references per sequence
  gpu_tests+=(test_paged_decode)


  # Checks against torch's fp32 math SDPA (--reference torch), where torch has it.
  reference_torch() {
    : > "$out/reference_torch.txt"
    "$build/flash_attn_mma" --list --sdpa > /dev/null 2>&1 || { echo "not run (no SDPA peers in this build)" > "$out/reference_torch.txt"; return; }
    for shape in "--N 1000 --D 64 --causal" "--Nq 1000 --Nk 4096 --D 128 --causal" "--Nq 129 --Nk 17 --D 256 --dtype bf16" "--N 127 --D 512"; do
      timeout "$(limit 100)" "$build/flash_attn_mma" --B 1 --H 8 $shape --check --no-peers --reference torch --iters 3 --warmup 1 --show-all \
        >> "$out/reference_torch.txt" 2>&1 || echo "exit $? at $shape" >> "$out/reference_torch.txt"
    done
  }
  [ -n "${SKIP_TORCH_REF:-}" ] || { reference_torch & pids+=($!); }

  # The tensor-core instructions of each rung's machine code (CPU only).
  sass_counts() {
    for obj in $(find "$build" -name '[01][0-9]_*.cu.o' | sort); do
      printf '%-24s HGMMA %5s  HMMA %5s\n' "$(basename "$obj" .cu.o)" \
        "$(cuobjdump -sass "$obj" 2>/dev/null | grep -c HGMMA)" "$(cuobjdump -sass "$obj" 2>/dev/null | grep -c ' HMMA')"
    done > "$out/sass_mma.txt" 2>&1
  }
  sass_counts & pids+=($!)

  step "CPU tests (ctest -L cpu)"
  timeout "$(limit 300)" ctest --test-dir "$build" -L cpu --output-on-failure > "$logs/ctest_cpu.log" 2>&1
  ctest_rc=$?
  tail -3 "$logs/ctest_cpu.log"

  step "waiting for the GPU tests, the sanitizers, the Python package"
  wait "${pids[@]}"

  # The tallies, for the summary: one line per test run, FAILED where it did not pass.
  {
    echo "- commit $ATTNLAB_COMMIT, $(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS)) s"
    echo "- ctest -L cpu: $(grep -E 'tests passed' "$logs/ctest_cpu.log" || echo "no result")$(
      [ $ctest_rc -eq 0 ] || echo " FAILED (exit $ctest_rc)")"
    for t in "${gpu_tests[@]}"; do
      line=$(cat "$logs/$t.rc" 2>/dev/null || echo "$t: no result")
      [[ "$line" == *" 0 failed" ]] || line="$line FAILED"
      echo "- $line"
    done
    while read -r line; do echo "- $line"; done < "$logs/python.rc"
    if [ -z "${SKIP_TORCH_REF:-}" ] && grep -q "^not run" "$out/reference_torch.txt"; then
      echo "- checks against torch's fp32 SDPA: $(head -1 "$out/reference_torch.txt")"
    elif [ -z "${SKIP_TORCH_REF:-}" ]; then
      checked=$(grep -cE ' (PASS|FAIL) ' "$out/reference_torch.txt")
      failing=$(grep -cE ' FAIL |^exit ' "$out/reference_torch.txt")
      echo "- checks against torch's fp32 SDPA: $checked rows, $failing failing$(
        [ "$failing" -eq 0 ] && [ "$checked" -gt 0 ] || echo " FAILED")"
    fi
  } > "$out/tests.txt"
  grep -q "FAILED\|no result" "$out/tests.txt" && ok=1
  [ $ctest_rc -eq 0 ] || ok=1
  if [ $sanitizers -eq 1 ]; then
    cat "$logs"/sanitizer/[0-9]*.txt > "$out/sanitizer_summary.txt" && rm -f "$logs"/sanitizer/{[0-9]*.txt,next}
    grep -vq ': rc=0 ' "$out/sanitizer_summary.txt" && ok=1
  fi
  finish $ok
fi

# ---- blocksparse: the fuzz tester and the benchmark against flex_attention ---------------
# Both in Python, on build/python (the module this build made), each under its
# share of BLOCKSPARSE_BUDGET (540) seconds.
if [ "$mode" = blocksparse ]; then
  ok=0
  budget=${BLOCKSPARSE_BUDGET:-540}
  export PYTHONPATH="$build_abs/python${PYTHONPATH:+:$PYTHONPATH}"
  part=${BLOCKSPARSE_PART:-all}
  if [ "$part" != bench ]; then
    step "the block-sparse fuzz tester (blocksparse_fuzz.txt)"
    timeout "$(limit 300)" python3 scripts/fuzz_blocksparse.py --out "$out/blocksparse_fuzz.txt" > "$logs/fuzz.log" 2>&1 || ok=1
    tail -1 "$out/blocksparse_fuzz.txt" 2>/dev/null || echo "no report (logs/fuzz.log)"
  fi
  if [ "$part" != fuzz ]; then
    step "the block-sparse benchmark against compiled flex_attention (blocksparse.csv)"
    rm -f "$out/blocksparse.csv"
    timeout "$(limit 600)" python3 scripts/bench_blocksparse.py --csv "$out/blocksparse.csv" > "$out/blocksparse.txt" 2>&1 ||
      { echo "bench_blocksparse.py: exit $? (blocksparse.txt)"; ok=1; }
    grep -E "x$" "$out/blocksparse.txt" | head -20
    regenerate_tables blocksparse.csv
  fi
  finish $ok
fi

# ---- bench and bwd: benchmarks, alone on the GPU ------------------------------------
ok=0
peers=(--torch)
"$build/flash_attn_mma" --list --sdpa >/dev/null 2>&1 && peers+=(--sdpa)
budget=${BWD_BUDGET:-540}  # bwd's; bench's runs are not cut
# run_bench LOG CSV ARGS : one harness run (at most $run_limit seconds), its
# output appended to LOG, its rows to CSV; a dot for a run that passed, a line
# for one that did not.
run_limit=180
run_bench() {
  local log=$1 rows=$2 rc
  shift 2
  timeout "$run_limit" "$build/flash_attn_mma" "$@" --csv "$rows" >> "$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then printf .; else printf '\nexit %d at: %s\n' $rc "$*" | tee -a "$log"; ok=1; fi
}

if [ "$mode" = bwd ]; then
  # ---- bwd: the dense backward's benchmark set ----------------------------------------
  # One harness run per shape: every backward rung and peer, each of dQ, dK,
  # dV checked against the fp32 reference backward, then timed. No run goes
  # on past BWD_BUDGET seconds (a cut run fails), and one that would start in
  # the last 30 seconds is reported as not run (and fails the step).
  csv="$out/bwd.csv"
  keep_previous bwd.csv
  rm -f "$csv"
  : > "$out/bwd.txt"
  bwd_bench() {
    if ((budget - SECONDS < 30)); then
      printf '\nNOT RUN (past the step'"'"'s time budget): %s\n' "$*" | tee -a "$out/bwd.txt"; ok=1; return
    fi
    run_limit=$(limit 240) run_bench "$out/bwd.txt" "$csv" --bwd "$@" "${peers[@]}" --check --show-all --iters 20 --warmup 3
  }
  step "dense backward benchmarks (bwd.csv)"
  for shape in "${bwd_set[@]}"; do
    bwd_bench $shape
  done
  echo
  # The GEMM ceiling and the clock the card sustains, right after those runs.
  python3 -c "import torch" 2>/dev/null &&
    timeout "$(limit 120)" python3 scripts/gemm_ceiling.py > "$out/gemm_ceiling_bwd.txt" 2>&1
  run_peers "$csv" "$out/bwd.txt" "$(limit "${PEERS_BUDGET:-240}")" --bwd
  if [ ! -s "$csv" ]; then
    echo "no rows in $csv"; ok=1
  elif grep -q ",FAIL," "$csv"; then
    echo "rows that FAILED their check: $(grep ",FAIL," "$csv" | cut -d, -f6 | sort -u | paste -sd, -)"; ok=1
  fi
  peer_drift "$csv"
  regenerate_tables bwd.csv
  finish $ok
fi

# ---- bench: the benchmark set -------------------------------------------------------
csv="$out/bench.csv"
keep_previous bench.csv
rm -f "$csv" "$out/dmattn.csv"
# bench ARGS : every variant and peer, checked and timed, into bench.csv.
bench() { run_bench "$out/bench.txt" "$csv" "$@" "${peers[@]}" --check --show-all --iters 20 --warmup 3; }
# Large shapes: timed only (the fp32 reference alone would take minutes).
bench_timing_only() { run_bench "$out/bench.txt" "$csv" "$@" "${peers[@]}" --no-check --show-all --iters 5 --warmup 1; }
# dbench ARGS : one dynamic-mask run (its rows and peers) into dmattn.csv, checked
# only where ARGS say --check.
dbench() {
  local check=(--no-check)
  [[ " $* " == *" --check "* ]] && check=()
  run_bench "$logs/dmattn_bench.txt" "$out/dmattn.csv" "$@" "${check[@]}" "${peers[@]}" --iters 10 --warmup 2
}
step "the harness at B=1 H=8 N=8192 D=512 (mission.txt)"
timeout 180 "$build/flash_attn_mma" --B 1 --H 8 --N 8192 --D 512 > "$out/mission.txt" 2>&1 ||
  { echo "exit $? at: flash_attn_mma --B 1 --H 8 --N 8192 --D 512"; ok=1; }
tail -2 "$out/mission.txt"
step "benchmarks (bench.csv)"
: > "$out/bench.txt"
# Page 12's steps towards the engine (ws+tma*, run on request) in the same runs as
# the engine, at B=1 H=8 N=8192 D=64, 128, 256, causal and not.
with_steps() { [[ $1 =~ ^--B\ 1\ --H\ 8\ --N\ 8192\ --D\ (64|128|256)(\ --causal)?$ ]]; }
for shape in "${bench_set[@]}"; do
  case $shape in
    @gemm_ceiling) python3 -c "import torch" 2>/dev/null &&
                     timeout 120 python3 scripts/gemm_ceiling.py --D 1024 512 > "$out/gemm_ceiling.txt" 2>&1 ;;
    --no-check*) bench_timing_only ${shape#--no-check } ;;
    *) if with_steps "$shape"; then bench $shape --variant '*,ws+tma*'; else bench $shape; fi ;;
  esac
done
echo
run_peers "$csv" "$out/bench.txt" "${PEERS_BUDGET:-240}"

if [ "${DMATTN:-1}" != 0 ]; then
  step "dynamic-mask attention: benchmarks (dmattn.csv)"
  # flash-dmattn's training shape: B=1 H=2 Hkv=1 D=128 causal, top-1024 keys of the bias per query
  # (--mask-bits: also the rows on the same mask bit-packed, checked bitwise against the byte mask's)
  for L in ${DMATTN_L:-1024 8192 16384 32768}; do
    dbench --B 1 --H 2 --Hkv 1 --N $L --D 128 --causal --mask topk --window 1024 --bias --mask-bits $([ $L -le 8192 ] && echo --check)
  done
  # the forward's mask scans where the automatic choice changes (in-kernel up to 16K keys per
  # block, then the pipelined pre-pass)
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan prepass
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan pipelined
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan in-kernel
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan prepass
  # decoding (Nq = 1): split-KV with the automatic split count, and forced counts. Plain
  # top-W (--block 0): with a random bias, 64-key majority smoothing would keep almost nothing.
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 32768 --D 128 --causal --mask topk --window 1024 --block 0 --bias --check
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 32768 --D 128 --causal --mask topk --window 1024 --block 0 --bias --check --splits 1
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --causal --mask topk --window 1024 --block 0 --bias
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias --mask-bits
  # decoding: the key-gather core (automatic) against the tile kernel, sparse and dense
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 524288 --D 128 --causal --mask topk --window 1024 --block 0 --bias --dma-core wgmma
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias
  dbench --B 1 --H 2 --Hkv 1 --Nq 1 --Nk 65536 --D 128 --mask ones --bias --dma-core wgmma
  # backward: checked where the reference is quick
  dbench --B 1 --H 2 --Hkv 1 --N 2048 --D 128 --causal --mask topk --window 512 --bias --bwd --check --mask-bits
  dbench --B 2 --H 4 --Hkv 2 --N 2048 --D 128 --causal --mask topk --window 512 --bias --deterministic --check --mask-bits
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --deterministic
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --bwd --mask-bits
  # the same with its own mask pre-pass (the in-kernel forward leaves no summary to reuse)
  dbench --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --bwd --dma-mask-scan in-kernel
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --bwd --check
  dbench --B 1 --H 2 --Hkv 1 --N 16384 --D 128 --causal --mask topk --window 1024 --bias --bwd-chunks 1
  dbench --B 1 --H 8 --N 1024 --D 128 --mask ones --bias --bwd --check
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --bwd --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --bwd --dma-core mma
  # the skipping machinery on an all-ones mask with a bias, against the dense split-q rung
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --check --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-core mma
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --dma-core mma
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --bwd --mask-bits
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-mask-scan in-kernel
  dbench --B 1 --H 8 --N 8192 --D 128 --mask ones --bias --dma-mask-scan pipelined
  dbench --B 1 --H 8 --N 8192 --D 64 --mask ones --bias --dma-mask-scan pipelined
  echo
fi

# Variable-length attention and paged decoding beside their peers, in one process
# (scripts/bench_varlen.py, on this build's module): attnlab's kernels have not run
# on a GPU yet, so --unverified (the rows are marked); PEERS=0: ours and the
# yardsticks alone; QUICK=1: --quick. Within VARLEN_BUDGET seconds (no case starts
# in the last 90 of them); the rows of the cases it ran stay in varlen.csv, its
# output in logs/varlen.txt. A row that FAILED, or one of ours that raised, fails the step.
varlen_budget=${VARLEN_BUDGET:-200}
step "variable length and paged decoding against their peers (scripts/bench_varlen.py) into varlen.csv"
rm -f "$out/varlen.csv"
varlen_args=(--unverified --csv "$out/varlen.csv" --budget $((varlen_budget > 150 ? varlen_budget - 90 : 60)))
[ "${PEERS:-1}" != 0 ] || varlen_args+=(--no-peers)
[ -z "${QUICK:-}" ] || varlen_args+=(--quick)
PYTHONPATH="$build_abs/python${PYTHONPATH:+:$PYTHONPATH}" timeout "$varlen_budget" \
  python3 scripts/bench_varlen.py "${varlen_args[@]}" 2>&1 | tee "$logs/varlen.txt" |
  grep -E '^(----|not run|[0-9]+ rows|bench_varlen|peers:|fa4:|flashinfer:|flex_attention:|sdpa nested:)|^  attnlab|FAIL'
varlen_rc=${PIPESTATUS[0]}
case $varlen_rc in
  0) ;;
  124) echo "bench_varlen.py: cut at $varlen_budget s (VARLEN_BUDGET; logs/varlen.txt)" ;;
  3) echo "bench_varlen.py: not run (no torch, GPU or attnlab module: logs/varlen.txt)" ;;
  *) echo "bench_varlen.py: exit $varlen_rc (logs/varlen.txt)"; ok=1 ;;
esac

if [ "${NCU:-1}" != 0 ] && command -v ncu >/dev/null; then
  step "ncu: shared-memory bank conflicts, padded vs swizzled (split-q, D=64 and 128)"
  { scripts/ncu_bank_conflicts.sh "$build/flash_attn_mma" 64; scripts/ncu_bank_conflicts.sh "$build/flash_attn_mma" 128; } \
    > "$out/ncu_bank_conflicts.txt" 2>&1
  step "ncu: one profile per main-path step, D=128 N=8192 (ncu_steps.csv: the ladder table's profile columns)"
  timeout 300 python3 scripts/ncu_steps.py --bin "$build/flash_attn_mma" --csv "$out/ncu_steps.csv" \
    > "$logs/ncu_steps.txt" 2>&1 || echo "ncu_steps.py: exit $? (logs/ncu_steps.txt)"
  cat "$logs/ncu_steps.txt" 2>/dev/null | tail -10
fi

if [ -n "${SWEEP:-}" ]; then
  step "sweep (fwd.csv)"
  SWEEP_OUT="$out" NO_PLOTS=1 BUILD_DIR="$build" timeout "${SWEEP_TIMEOUT:-400}" scripts/sweep ${SWEEP_ARGS:-} \
    > "$logs/sweep.txt" 2>&1 || ok=1
  tail -1 "$logs/sweep.txt"
fi

grep -q ",FAIL," "$csv" "$out/dmattn.csv" 2>/dev/null && ok=1
peer_drift "$csv"
regenerate_tables "the CSVs"
finish $ok
