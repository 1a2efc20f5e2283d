#!/usr/bin/env bash
# flash_attn_mma on bad input: a one-line error naming the problem and the
# documented exit code (2 bad options, 3 no usable GPU, 1 a failed run), never
# a crash; --help and --list. Runs with or without a GPU.
#   bash tests/cpu/test_harness_errors.sh build/flash_attn_mma
set -u
bin="$1"
passed=0
failed=0
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT

pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAILED: $*"; }

expect_error() {  # expect_error CODE "substring" args...
  local code="$1" want="$2"
  shift 2
  local err rc
  err=$("$bin" "$@" 2>&1 >/dev/null)
  rc=$?
  local lines
  lines=$(printf '%s' "$err" | grep -c '')
  if [ "$rc" -eq "$code" ] && [ "$lines" -eq 1 ] && [[ "$err" == *"$want"* ]]; then
    pass
  else
    fail "flash_attn_mma $* -> exit $rc, stderr ($lines lines): $err (wanted exit $code and '$want')"
  fi
}

# Bad options: exit 2, found before anything runs (so the same with or without a GPU).
expect_error 2 "--D must be between 1 and 1024" --D 0
expect_error 2 "--N must be between 1" --N -5
expect_error 2 "--N must be between 1 and 1073741824, got 99999999999" --N 99999999999
expect_error 2 "--dtype must be fp16 or bf16, got 'fp8'" --dtype fp8
expect_error 2 "--B expects an integer, got 'abc'" --B abc
expect_error 2 "--B expects an integer, got '1x'" --B 1x
expect_error 2 "--B expects an integer, got ''" --B ""
expect_error 2 "--seed expects a non-negative integer, got ' -1'" --seed " -1"
expect_error 2 "--seed expects a non-negative integer, got '-1'" --seed -1
expect_error 2 "--softcap expects a number from 0 to 1e6" --mask none --softcap nan
expect_error 2 "--softcap expects a number from 0 to 1e6" --mask none --softcap -1
expect_error 2 "unknown option" --bogus
expect_error 2 "--D given twice" --D 64 --D 128
expect_error 2 "--iters given twice" --iters 5 --warmup 1 --iters 3
expect_error 2 "no variant matches" --variant 'no-such-variant*'
expect_error 2 "--mask must be none, causal, ones or topk" --mask random
expect_error 2 "--H must be a multiple of --Hkv, got --H 8 and --Hkv 3" --H 8 --Hkv 3
expect_error 2 "--H must be a multiple of --Hkv, got --H 8 and --Hkv 3" --H 8 --Hkv 3 --mask none --bias
expect_error 2 "add --bias" --mask topk
# Options that mean nothing without another one.
expect_error 2 "--window needs --mask topk" --mask none --splits 4 --window 64
expect_error 2 "--window needs --mask topk" --mask ones --window 64
expect_error 2 "--block needs --mask topk" --mask ones --block 0
expect_error 2 "--sweep-N needs --sweep" --sweep-N 1024
expect_error 2 "--N does not apply to --sweep" --sweep --N 1024
expect_error 2 "--reference does not apply with --no-check" --no-check --reference fp32
# Checks and peers are on by default; asking for them and against them at once is an error.
expect_error 2 "--check and --no-check contradict each other" --check --no-check
expect_error 2 "--torch and --no-peers contradict each other" --no-peers --torch
expect_error 2 "--sdpa and --no-peers contradict each other" --sdpa --no-peers
expect_error 2 "--check and --no-check contradict each other" --mask none --no-check --check
expect_error 2 "--N has no effect with both --Nq and --Nk" --N 64 --Nq 1 --Nk 64
expect_error 2 "--dma-mask-scan reads the mask" --mask none --dma-mask-scan prepass
# Each option belongs to one program or more: given to another, one line says whose it is.
expect_error 2 "--variant is an option of the dense forward and the dense backward; this run is dynamic-mask attention (--mask M)" \
  --mask none --bias --variant 'split-q*'
expect_error 2 "--bias is an option of dynamic-mask attention (--mask M); this run is the dense forward" --bias
expect_error 2 "--softcap is an option of dynamic-mask attention (--mask M); this run is the dense backward (--bwd)" \
  --bwd --softcap 30
expect_error 2 "--mask and --mask-mod select two programs" --mask ones --mask-mod causal
# The dense backward (--bwd alone): its own option errors, before anything runs.
expect_error 2 "--sweep is an option of the dense forward; this run is the dense backward (--bwd)" --bwd --sweep
expect_error 2 "--reference is an option of the dense forward; this run is the dense backward" --bwd --reference torch
expect_error 2 "no backward variant matches --variant 'no-such-variant*'" --bwd --variant 'no-such-variant*'
expect_error 2 "--H must be a multiple of --Hkv" --bwd --H 8 --Hkv 3
expect_error 2 "--dtype must be fp16 or bf16" --bwd --dtype fp32
expect_error 2 "cannot write --csv /nonexistent/dir/x.csv" --bwd --N 64 --csv /nonexistent/dir/x.csv
expect_error 2 "no deterministic backward variant matches --variant 'bwd-mma' (see --list --bwd --deterministic)" \
  --deterministic --variant bwd-mma
# ... while dmattn's backward options still select the dynamic-mask mode, whose rules apply.
expect_error 2 "--variant is an option of the dense forward and the dense backward; this run is dynamic-mask" \
  --mask none --bwd-chunks 2 --variant 'bwd*'
expect_error 2 "dynamic-mask attention needs Dv == D" --bwd --mask none --Dv 32
# Block-sparse attention (--mask-mod): its specs and the flags it does not combine with.
expect_error 2 "--mask-mod: unknown mask_mod 'foo'" --mask-mod foo
expect_error 2 "--mask-mod: mask_mod sliding_window takes LEFT,RIGHT, got '1'" --mask-mod sliding_window:1
expect_error 2 "--mask-mod document:K takes K documents, 1 to the sequence length 10, got '11'" --N 10 --mask-mod document:11
expect_error 2 "--score-mod: unknown score_mod 'nope'" --mask-mod causal --score-mod nope
expect_error 2 "--score-mod is an option of block-sparse attention (--mask-mod M); this run is the dense forward" \
  --score-mod alibi
expect_error 2 "--block-size is an option of block-sparse attention (--mask-mod M)" --block-size 256
expect_error 2 "--block-size takes Q,KV or one size for both" --mask-mod causal --block-size 128,128,128
expect_error 2 "this run is block-sparse attention (--mask-mod M); block-sparse attention's causal mask is --mask-mod causal" \
  --mask-mod causal --causal
expect_error 2 "--bias is an option of dynamic-mask attention (--mask M); this run is block-sparse attention" \
  --mask-mod causal --bias
expect_error 2 "--variant is an option of the dense forward and the dense backward; this run is block-sparse" \
  --mask-mod none --variant 'ws*'
# What the kernel's tile makes of --block-size is an option error, found before the GPU is looked for.
expect_error 2 "--block-size 100,100 is not a multiple of the kernel tile 128 x 128" --mask-mod causal --block-size 100
expect_error 2 "--block-size 64,128 is not a multiple of the kernel tile" --mask-mod causal --block-size 64,128 --N 256 --D 64
expect_error 2 "--block-size 64,64 is not a multiple of the kernel tile" --bwd --mask-mod causal --block-size 64
expect_error 2 "the block-sparse forward: head dims 96 not in" --mask-mod causal --D 96
# Variable-length attention (--varlen): its lengths, the flags it refuses, and the opt-in its kernel needs,
# each found before the GPU is looked for.
expect_error 2 "--varlen takes lengths separated by commas (8192,1,517,3000) or random:B,MEAN, got '8192,,1'" \
  --varlen 8192,,1
expect_error 2 "--varlen: sequence length -5 is negative" --varlen 1,-5
expect_error 2 "--varlen random:B,MEAN takes B from 1 to 65535 sequences, got 0" --varlen random:0,5
expect_error 2 "--varlen random:B,MEAN takes a mean length MEAN from 1 to" --varlen random:4,0
expect_error 2 "--varlen takes lengths separated by commas" --varlen random:4
expect_error 2 "--varlen: the lengths sum to 2147483648 rows, more than the 2147483647" --varlen 1073741824,1073741824
expect_error 2 "may sum to" --varlen random:65535,40000
expect_error 2 "--varlen-k gives 1 key length for 2 sequences (--varlen): one per sequence" --varlen 1,2 --varlen-k 3
for flag in --B --N --Nk; do
  expect_error 2 "$flag is an option of every program but variable-length attention and paged decoding; this run is variable-length attention (--varlen LENGTHS); the sequences and their lengths come from --varlen" \
    --varlen 4,5 "$flag" 4
done
expect_error 2 "--Nq is an option of every program but variable-length attention; this run is variable-length attention (--varlen LENGTHS); the sequences and their lengths come from --varlen" \
  --varlen 4,5 --Nq 4
expect_error 2 "; the harness does not time the variable-length backward yet (build/test_varlen checks it)" --varlen 4,5 --bwd
expect_error 2 "; the harness does not time the variable-length backward yet (build/test_varlen checks it)" --varlen 4,5 --deterministic
expect_error 2 "--varlen and --mask-mod select two programs" --varlen 4 --mask-mod causal
expect_error 2 "--unverified is an option of variable-length attention and paged decoding; this run is the dense forward" \
  --unverified
expect_error 2 "the variable-length kernel has not run on a GPU yet; pass --unverified to run it anyway" \
  --varlen 8192,1,517,3000 --H 8 --D 128
if [ "$("$bin" --list --varlen 4 | awk -F'  +' '{ print $1 }' | tr '\n' '|')" = "varlen (unverified)|dense padded (engine)|" ]
then pass; else fail "--list --varlen: varlen (unverified) and dense padded (engine)"; fi
# Paged decoding (--decode): its cache lengths, its new tokens and pages, the flags it refuses, and the
# opt-in its kernel needs, each found before the GPU is looked for.
expect_error 2 "--decode takes lengths separated by commas (8192,1,517,3000) or random:B,MEAN, got '4096,,1'" \
  --decode 4096,,1
expect_error 2 "--decode: sequence length -5 is negative" --decode 1,-5
expect_error 2 "--decode random:B,MEAN takes B from 1 to 65535 sequences, got 0" --decode random:0,5
expect_error 2 "--decode takes lengths separated by commas" --decode random:4
expect_error 2 "--Nq must be between 1 and 1024, got 1025" --decode 4096 --Nq 1025
expect_error 2 "--Nq must be between 1 and 1024, got 0" --decode 4096 --Nq 0
expect_error 2 "--page-size must be between 1 and 1073741824, got 0" --decode 4096 --page-size 0
expect_error 2 "--page-size expects an integer, got '16k'" --decode 4096 --page-size 16k
expect_error 2 "--causal and --no-causal contradict each other" --decode 4096 --causal --no-causal
expect_error 2 "paged decoding needs Dv == D, got --D 128 and --Dv 64" --decode 4096 --D 128 --Dv 64
for flag in --B --N --Nk; do
  expect_error 2 "$flag is an option of every program but variable-length attention and paged decoding; this run is paged decoding (--decode LENGTHS); the sequences and their cache lengths come from --decode (--Nq: the new tokens of each)" \
    --decode 4,5 "$flag" 4
done
expect_error 2 "; this run is paged decoding (--decode LENGTHS); paged decoding has a forward only (decoding is inference)" \
  --decode 4,5 --bwd
expect_error 2 "; this run is paged decoding (--decode LENGTHS); paged decoding has a forward only (decoding is inference)" \
  --decode 4,5 --deterministic
for flag in --torch --sdpa --no-peers; do
  expect_error 2 "$flag is an option of" --decode 4 "$flag"
  expect_error 2 "; paged decoding has no peers (its copy row is a bandwidth yardstick)" --decode 4 "$flag"
done
expect_error 2 "--varlen-k is an option of variable-length attention (--varlen LENGTHS); this run is paged decoding" \
  --decode 4 --varlen-k 4
expect_error 2 "--page-size is an option of paged decoding (--decode LENGTHS); this run is the dense forward" --page-size 16
expect_error 2 "--no-causal is an option of paged decoding (--decode LENGTHS); this run is the dense forward" --no-causal
expect_error 2 "--varlen and --decode select two programs (variable-length attention and paged decoding): give one" \
  --varlen 4 --decode 4
expect_error 2 "the paged-decoding kernel has not run on a GPU yet; pass --unverified to run it anyway" \
  --decode 4096,1,0,517 --H 32 --Hkv 8 --D 128
if [ "$("$bin" --list --decode 4 | awk -F'  +' '{ print $1 }' | tr '\n' '|')" = "decode (unverified)|copy (bandwidth)|" ]
then pass; else fail "--list --decode: decode (unverified) and copy (bandwidth)"; fi
# The mods that read a caller's tensor: one plain sentence; the lists offer only what the harness runs.
expect_error 2 "--mask-mod tensor reads a keep tensor, which the harness does not make" --mask-mod tensor
expect_error 2 "--score-mod bias reads a bias tensor, which the harness does not make" --mask-mod causal --score-mod bias
for args in "--mask-mod foo" "--mask-mod causal --score-mod nope" "--mask-mod tensor" "--mask-mod causal --score-mod bias"; do
  # shellcheck disable=SC2086
  err=$("$bin" $args 2>&1 >/dev/null)
  if [[ "$err" == *", tensor"* || "$err" == *", bias"* ]]; then fail "$args offers a mod the harness rejects: $err"; else pass; fi
done
if "$bin" --list --bwd --mask-mod causal | grep -q "^blocksparse-det bwd "; then pass; else fail "--list --bwd --mask-mod shows blocksparse-det bwd"; fi
if "$bin" --list --mask-mod causal | grep -q "^blocksparse "; then pass; else fail "--list --mask-mod shows blocksparse"; fi
# --deterministic: the deterministic backward of each mode, its rows alone.
if [ "$("$bin" --list --mask-mod causal --deterministic --no-peers | awk '{ print $1, $2 }')" = "blocksparse-det bwd" ]
then pass; else fail "--list --mask-mod causal --deterministic: blocksparse-det bwd alone"; fi
if out=$("$bin" --list --deterministic --no-peers) && [ -n "$out" ] && ! printf '%s\n' "$out" | grep -qv '^[^ ]*+deterministic bwd '
then pass; else fail "--list --deterministic: the deterministic backward rungs alone: $out"; fi
printf 'gpu,driver,cuda\n' > "$tmp/other.csv"
expect_error 2 "cannot write --csv $tmp/other.csv: its columns are not these rows'" --mask-mod causal --csv "$tmp/other.csv"
expect_error 2 "cannot write --csv $tmp/other.csv: its columns are not these rows'" --varlen 4 --unverified \
  --csv "$tmp/other.csv"
expect_error 2 "cannot write --csv $tmp/other.csv: its columns are not these rows'" --decode 4 --unverified \
  --csv "$tmp/other.csv"
# --csv that cannot be written: found before anything runs, nothing written.
expect_error 2 "cannot write --csv /nonexistent/dir/x.csv: No such file or directory" --csv /nonexistent/dir/x.csv
expect_error 2 "cannot write --csv $tmp: it is a directory" --csv "$tmp"
expect_error 2 "cannot write --csv /nonexistent/dir/x.csv" --mask none --bias --N 64 --D 64 --H 1 --csv /nonexistent/dir/x.csv
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere
  mkdir "$tmp/ro" && chmod a-w "$tmp/ro"
  expect_error 2 "cannot write --csv $tmp/ro/x.csv: Permission denied" --csv "$tmp/ro/x.csv"
fi

# Without torch in the build, --sdpa says so; with torch, --list shows the SDPA rows.
if "$bin" --list --sdpa >/dev/null 2>&1; then
  if "$bin" --list --sdpa | grep -q "sdpa(flash)"; then pass; else fail "--list --sdpa"; fi
else
  expect_error 2 "this build has none" --sdpa
fi

# --list: every peer of the build by default, none with --no-peers.
if "$bin" --list | grep -q "^unfused "; then pass; else fail "--list shows the unfused peer by default"; fi
if "$bin" --list --no-peers | grep -q "^unfused "; then fail "--list --no-peers shows a peer"; else pass; fi

# --list --bwd: the backward rows, each named '<name> bwd' (none may be there without torch).
if out=$("$bin" --list --bwd) && ! printf '%s\n' "$out" | grep -v '^$' | awk '{ print $1, $2 }' | grep -qv ' bwd$'; then
  pass
else
  fail "--list --bwd: $out"
fi
if "$bin" --list --bwd --no-peers | grep -q "^sdpa"; then fail "--list --bwd --no-peers shows a peer"; else pass; fi

# --help and --list need no GPU. --help documents the exit codes, in its
# synopsis (the first thirteen lines) too, and wins over any other option.
if "$bin" --help | grep -q -- "--causal"; then pass; else fail "--help"; fi
if "$bin" --help | grep -q "exit status: 0"; then pass; else fail "--help documents the exit codes"; fi
if "$bin" --help | head -13 | grep -q "^exit status: 0 ok, 1 a check or the run failed, 2 bad options, 3"; then pass
else fail "--help: no synopsis with the exit codes in its first thirteen lines"; fi
for args in "--help --D 0" "--D 0 --help" "--bogus -h"; do
  # shellcheck disable=SC2086
  if out=$("$bin" $args 2>&1) && [[ "$out" == "flash_attn_mma — time and check"* ]]; then pass
  else fail "flash_attn_mma $args: not the help, exit 0"; fi
done
if "$bin" --list | grep -q "split-q+stage2"; then pass; else fail "--list"; fi
# --list: the rung and the description start in one column on every line
# (the columns are separated by two spaces or more; a rung may hold one).
columns=$("$bin" --list --torch | awk '{
  match($0, /  +/); rung = RSTART + RLENGTH
  match(substr($0, rung), /  +/); desc = rung + RSTART + RLENGTH - 1
  print rung, desc }' | sort -u)
if [ "$(printf '%s\n' "$columns" | grep -c '')" -eq 1 ]; then pass; else fail "--list columns misaligned: $columns"; fi

# A valid shape: runs where there is a GPU (exit 0); elsewhere exit 3 and one
# line, in every mode, that says plainly what is missing (no driver, a driver
# too old, no GPU) and then quotes CUDA, having written nothing to --csv.
out=$("$bin" --B 1 --H 1 --N 64 --D 64 --iters 1 --warmup 0 --csv "$tmp/rows.csv" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  pass
  if [ "$(grep -c '' "$tmp/rows.csv")" -gt 1 ]; then pass; else fail "--csv: no rows in $tmp/rows.csv"; fi
elif [ "$rc" -eq 3 ] && [ "$(printf '%s' "$out" | grep -c '')" -eq 1 ] &&
    [[ "$out" =~ ^"flash_attn_mma: error: "("no NVIDIA driver found"|"the NVIDIA driver runs CUDA"|"no NVIDIA GPU found"|"no usable NVIDIA GPU").*" (CUDA: cuda"[A-Za-z]+(": "|" found no device").*")"$ ]]; then
  pass
  if [ ! -e "$tmp/rows.csv" ]; then pass; else fail "--csv file left behind by a run that did not start"; fi
  expect_error 3 "${out#flash_attn_mma: error: }" --mask none --bias --N 64 --D 64 --H 1 --iters 1 --warmup 0
  expect_error 3 "${out#flash_attn_mma: error: }" --bwd --N 64 --D 64 --H 1 --iters 1 --warmup 0
  expect_error 3 "${out#flash_attn_mma: error: }" --mask-mod causal --N 64 --D 64 --H 1 --iters 1 --warmup 0
  expect_error 3 "${out#flash_attn_mma: error: }" --varlen 64,17 --D 64 --H 1 --iters 1 --warmup 0 --unverified
  expect_error 3 "${out#flash_attn_mma: error: }" --decode 64,17 --D 64 --H 1 --iters 1 --warmup 0 --unverified
else
  fail "valid shape -> exit $rc: $out"
fi

# Only meaningful where there is a GPU: a shape far too large for it, and a
# --csv whose writes fail (the rows are lost: exit 1, not 0).
if [ "$rc" -eq 0 ]; then
  expect_error 1 "of GPU memory" --B 64 --H 64 --N 1048576 --D 1024
  expect_error 1 "of GPU memory" --bwd --B 64 --H 64 --N 1048576 --D 1024
  # The dense backward on a small shape: every row that runs passes (exit 0), its rows in the CSV.
  if "$bin" --bwd --B 1 --H 4 --Hkv 2 --Nq 70 --Nk 130 --D 64 --causal --iters 1 --warmup 0 \
      --csv "$tmp/bwd.csv" >/dev/null 2>&1; then pass; else fail "--bwd on a small shape"; fi
  # The block-sparse forward on a small ragged shape: every row passes (exit 0), its rows with mask and score.
  if "$bin" --mask-mod sliding_window:64,0 --score-mod alibi --B 1 --H 2 --Nq 300 --Nk 500 --D 64 --iters 1 \
      --warmup 0 --csv "$tmp/bs.csv" >/dev/null 2>&1 && head -1 "$tmp/bs.csv" | grep -q ",note,mask,score$" &&
      grep -q ",sliding_window:64;0,alibi$" "$tmp/bs.csv"; then pass; else fail "--mask-mod on a small shape"; fi
  # Variable-length attention on a small ragged batch (sequences without queries, without keys): every row
  # passes (exit 0), its rows with the lengths and the packed row counts.
  if "$bin" --varlen 300,0,1,129 --varlen-k 500,7,0,129 --causal --H 4 --Hkv 2 --D 64 --iters 1 --warmup 0 \
      --unverified --csv "$tmp/vl.csv" >/dev/null 2>&1 &&
      head -1 "$tmp/vl.csv" | grep -q ",note,lengths,lengths_k,total_q,total_k,unverified$" &&
      grep -q "^[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,varlen (unverified),rung,4,4,300,500,.*,300;0;1;129,500;7;0;129,430,636,1$" \
        "$tmp/vl.csv"; then pass; else fail "--varlen on a small ragged batch"; fi
  # Paged decoding on a small ragged batch (an empty cache, one shorter than the new tokens, odd pages, GQA):
  # our row passes (exit 0); its rows with the lengths, the page size and the copy's share.
  if "$bin" --decode 300,0,3,129 --Nq 4 --page-size 7 --H 4 --Hkv 2 --D 64 --iters 1 --warmup 0 --unverified \
      --csv "$tmp/dec.csv" >/dev/null 2>&1 &&
      head -1 "$tmp/dec.csv" | grep -q ",note,lengths,page_size,bytes,gbps,copy_fraction,unverified$" &&
      grep -q "^[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,decode (unverified),rung,4,4,4,300,64,64,.*,PASS,.*,300;0;3;129,7,[0-9]*,[0-9.]*,[0-9.]*,1$" \
        "$tmp/dec.csv" &&
      grep -q "^[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,copy (bandwidth),rung,.*,1.000,1$" "$tmp/dec.csv"; then pass
  else fail "--decode on a small ragged batch"; fi
  if [ -w /dev/full ]; then
    expect_error 1 "writing --csv /dev/full failed" --B 1 --H 1 --N 64 --D 64 --iters 1 --warmup 0 --variant split-q+stage2 \
      --csv /dev/full
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
