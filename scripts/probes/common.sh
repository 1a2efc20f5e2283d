# Sourced by the session probes (run from the repository root): where output
# goes ($OUT: what the device returns; /tmp/logs: tarred at the end), the
# harness path, a timer, and the build of the targets a probe needs.
# The device's git sees the landed commit plus this session's as a diff, so a
# run that writes a CSV names its commit only if told: start the device command
# with ATTNLAB_COMMIT=<this checkout's short HEAD>.
O=${OUT:-/tmp/out}; L=/tmp/logs; mkdir -p "$O" "$L"
B=build-gpu; F=$B/flash_attn_mma
exec > >(tee "$O/summary.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
probe_build() {  # probe_build TARGET... : configure (with torch when python3 has it) and build, or exit
  local tp
  tp=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
  { cmake -S . -B "$B" -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$tp" &&
    cmake --build "$B" -j "${PROBE_JOBS:-16}" --target "$@"; } > "$L/build.log" 2>&1 || { tail -40 "$L/build.log"; exit 1; }
  el built
}
# probe_build_ab "FLAGS" TARGET... : an A/B's two builds side by side — this
# tree (probe_build TARGET...) and, in build-gpu-b, the harness compiled with
# -DCMAKE_CUDA_FLAGS="FLAGS" (the compile-time switch that gives the other
# side; no torch) — or exit. FB: that other harness.
probe_build_ab() {
  local flags=$1 pb
  shift
  { cmake -S . -B build-gpu-b -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF "-DCMAKE_CUDA_FLAGS=$flags" &&
    cmake --build build-gpu-b -j 6 --target flash_attn_mma; } > "$L/build_b.log" 2>&1 &
  pb=$!
  PROBE_JOBS=10 probe_build "$@"
  wait $pb || { tail -30 "$L/build_b.log"; exit 1; }
  FB=build-gpu-b/flash_attn_mma
  el "built both"
}

# probe_build_with_head TARGET... : this tree (probe_build TARGET...) and,
# beside it in /tmp/old, the harness of the landed commit (HEAD, no torch) —
# the same-call A/B against what is landed. FO: that harness, empty if its
# build failed.
probe_build_with_head() {
  local pb
  mkdir -p /tmp/old && git archive HEAD | tar -x -C /tmp/old && (
    cmake -S /tmp/old -B /tmp/old/b -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNLAB_WITH_TORCH=OFF &&
    cmake --build /tmp/old/b -j 6 --target flash_attn_mma) > $L/build_old.log 2>&1 &
  pb=$!
  PROBE_JOBS=10 probe_build "$@"
  wait $pb && FO=/tmp/old/b/flash_attn_mma || { tail -20 $L/build_old.log; FO=; }
  el "old build: ${FO:-failed}"
}

# racecheck_runs N : gpu_check's racecheck of the rungs at D=1024 causal (the shape
# that caught rung 10's red_free release in session 7), N times; a failing
# run's hazards are printed and its log returned.
racecheck_runs() {
  local i rc
  for i in $(seq 1 "$1"); do
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 --Nq 70 --Nk 130 --D 1024 --causal \
      --iters 1 --warmup 0 --check --show-all > $L/race$i.log 2>&1; rc=$?
    el "racecheck $i rc=$rc $(grep -E 'RACECHECK SUMMARY' $L/race$i.log)"
    [ $rc != 0 ] && { grep -v "^=========     " $L/race$i.log | grep -E "=========|FAIL|rror" | head -20 | cut -c1-220; cp $L/race$i.log $O/; }
  done
}

# variant_sanitizers VARIANT [SHAPE...] : memcheck, racecheck three times and
# synccheck (SAN_TOOLS overrides the list) of one rung's row at each SHAPE
# (default: gpu_check's D = 1024 causal shape), tool by tool; a failing run's
# hazards are printed.
variant_sanitizers() {
  local tool rc shape v=$1
  shift
  local shapes=("$@")
  [ ${#shapes[@]} = 0 ] && shapes=("--Nq 70 --Nk 130 --D 1024 --causal")
  for tool in ${SAN_TOOLS:-memcheck racecheck racecheck racecheck synccheck}; do
    for shape in "${shapes[@]}"; do
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $F --B 1 --H 2 $shape \
        --variant "$v" --iters 1 --warmup 0 --check > $L/san.log 2>&1; rc=$?
      el "$v $tool $shape rc=$rc $(grep -E 'SUMMARY' $L/san.log) $(grep -c FAIL $L/san.log) FAIL"
      [ $rc != 0 ] && { grep -v "^=========     " $L/san.log | grep -E "=========|FAIL|rror" | head -12 | cut -c1-200; }
    done
  done
}

# run_test SECONDS TEST [ARGS...] : a GPU test binary under a timeout, its log
# in $L/TEST.log, a line with its exit status and last line, and its first FAILs.
run_test() {
  local secs=$1 name=$2 log=$L/$2.log
  shift 2
  timeout "$secs" "$B/$name" "$@" > "$log" 2>&1
  el "$name rc=$? $(tail -1 "$log")"
  grep -m12 FAIL "$log" | cut -c1-240
}

# dm_time ARGS... : one dmattn row of the harness, as "time ms TFLOPS" (20
# timed runs after 3 warm-ups, under a timeout).
dm_time() {
  timeout 30 $F "$@" --iters 20 --warmup 3 2>&1 | grep -E "^ *dmattn" |
    sed -E 's/ +dmattn: time:/ /; s/, effective TFLOPS:/ ms /' | cut -c1-40
}
# dm_ab LABEL ARGS... : the plain dmattn row (not the summary-given one) of
# $FO (the A/B's other build) then of $F.
dm_ab() {
  local bin
  for bin in "$FO" "$F"; do
    echo "$1 $([ "$bin" = "$F" ] && echo new || echo old): $(timeout 30 "$bin" "${@:2}" --iters 20 --warmup 3 2>&1 |
      grep -m1 -E "^ *dmattn:" | sed -E 's/ +dmattn: time:/ /; s/, effective TFLOPS:/ ms /' | cut -c1-40)"
  done
}

# bwd_row BINARY ARGS... : the backward row (plain or deterministic) of one
# harness run of BINARY (this tree's $F or an A/B's other build), 20 timed
# runs after 3 warm-ups, under a timeout. BWD_DENSE / BWD_SPARSE: the
# all-active shape (add --D) and the training shape's causal top-1024 (add --N).
bwd_row() {
  timeout 60 "$1" "${@:2}" --bwd --iters 20 --warmup 3 2>&1 | grep -E "dmattn bwd( \(deterministic\))?:" | cut -c1-100
}
# bwd_checks SHAPE... : the backward row of this tree's $F with --check on
# each shape (one quoted string of flags), plain and deterministic; then
# test_dmattn_backward and bwd_sanitizers — an A/B's correctness half.
bwd_checks() {
  local s c="--iters 1 --warmup 0 --check"
  for s in "$@"; do
    echo "A $s: $($F $s --bwd $c 2>&1 | grep -E 'dmattn bwd:' | cut -c30-150)"
    echo "A det: $($F $s --bwd --deterministic $c 2>&1 | grep -E 'dmattn bwd \(det' | cut -c30-150)"
  done
  run_test 200 test_dmattn_backward
  bwd_sanitizers
}
# bwd_ab LABEL ARGS... : the same row from $FO (the A/B's other build) then $F.
bwd_ab() {
  echo "$1 old: $(bwd_row "$FO" "${@:2}")"
  echo "$1 new: $(bwd_row "$F" "${@:2}")"
}
# bwd_ab_shapes : bwd_ab on the all-active shape (D = 128, 64) and the
# training shape's top-1024 (L = 16K, 32K).
bwd_ab_shapes() {
  local D N
  for D in 128 64; do bwd_ab "all-active D=$D" $BWD_DENSE --D $D; done
  for N in 16384 32768; do bwd_ab "top-1024 L=$N" $BWD_SPARSE --N $N; done
}
# bwd_peers ARGS... : this tree's backward row and the torch peers' backward
# rows of one run (10 timed runs after 2 warm-ups).
bwd_peers() {
  timeout 120 "$F" "$@" --bwd --torch --sdpa --iters 10 --warmup 2 2>&1 | grep -E "bwd[^:]*:" | cut -c1-150
}
BWD_DENSE="--B 1 --H 8 --N 8192 --mask ones --bias"
BWD_SPARSE="--B 1 --H 2 --Hkv 1 --D 128 --causal --mask topk --window 1024 --bias"

# bwd_sanitizers : racecheck and memcheck of the backward (wgmma core) on three
# ragged shapes: D = 128 with query chunks, D = 128 with Nk < Nq, D = 64 GQA.
# (W = 64 of 130 keys: with --block 64's majority vote a W under ~Nk/2 leaves
# an all-zero mask; W = 48 and 32, used until session 14, left 2 of 12 and 0 of
# 6 tiles active.)
bwd_sanitizers() {
  local s
  for s in "--Nq 200 --Nk 130 --D 128 --Hkv 1 --causal --mask topk --window 64 --bias --bwd --bwd-chunks 3" \
           "--Nq 130 --Nk 77 --D 128 --mask topk --window 16 --block 0 --bias --bwd" \
           "--Nq 70 --Nk 130 --D 64 --Hkv 1 --causal --mask topk --window 64 --bias --bwd"; do
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $F --B 1 --H 2 $s --iters 1 --warmup 0 --check > $L/race.log 2>&1
    el "racecheck rc=$? $s $(grep -E 'RACECHECK SUMMARY' $L/race.log)"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $F --B 1 --H 2 $s --iters 1 --warmup 0 --check > $L/mem.log 2>&1
    el "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/mem.log)"
  done
}
