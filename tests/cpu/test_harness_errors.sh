#!/usr/bin/env bash
# flash_attn_mma on bad input: a one-line error naming the problem and a non-zero
# exit, never a crash. Runs with or without a GPU.
set -u
bin="$1"
passed=0
failed=0

expect_error() {  # expect_error CODE "substring" args...
  local code="$1" want="$2"
  shift 2
  local err rc
  err=$("$bin" "$@" 2>&1 >/dev/null)
  rc=$?
  local lines
  lines=$(printf '%s' "$err" | grep -c '')
  if [ "$rc" -eq "$code" ] && [ "$lines" -eq 1 ] && [[ "$err" == *"$want"* ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: flash_attn_mma $* -> exit $rc, stderr ($lines lines): $err (wanted exit $code and '$want')"
  fi
}

expect_error 2 "--D must be between 1 and 1024" --D 0
expect_error 2 "--N must be between 1" --N -5
expect_error 2 "--dtype must be fp16 or bf16, got 'fp8'" --dtype fp8
expect_error 2 "--B expects an integer, got 'abc'" --B abc
expect_error 2 "unknown option" --bogus
expect_error 2 "no variant matches" --variant 'no-such-variant*'
expect_error 2 "--mask must be none, causal, ones or topk" --mask random
expect_error 2 "--H must be a multiple of --Hkv" --H 8 --Hkv 3
expect_error 2 "add --bias" --mask topk

# Without torch in the build, --sdpa says so; with torch, --list shows the SDPA rows.
if "$bin" --list --sdpa >/dev/null 2>&1; then
  if "$bin" --list --sdpa | grep -q "sdpa(flash)"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: --list --sdpa"; fi
else
  expect_error 2 "this build has none" --sdpa
fi

# --help and --list need no GPU.
if "$bin" --help | grep -q -- "--causal"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: --help"; fi
if "$bin" --list | grep -q "split-q+stage2"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: --list"; fi

# A valid shape: runs where there is a GPU; elsewhere one line saying there is none.
out=$("$bin" --B 1 --H 1 --N 64 --D 64 --iters 1 --warmup 0 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  passed=$((passed + 1))
elif [ "$rc" -eq 1 ] && [ "$(printf '%s' "$out" | grep -c '')" -eq 1 ] && [[ "$out" == *"no CUDA GPU found"* ]]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAILED: valid shape -> exit $rc: $out"
fi

# A shape far too large for any GPU (only meaningful where there is one).
if [ "$rc" -eq 0 ]; then
  expect_error 1 "of GPU memory" --B 64 --H 64 --N 1048576 --D 1024
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
