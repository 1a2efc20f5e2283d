#!/usr/bin/env bash
# scripts/dmattn_tables without a GPU: every row's command line must parse
# (flash_attn_mma's own parser, through a stand-in that appends --help, so
# nothing runs even where there is a GPU), every row must also run the
# bit-packed mask (--mask-bits), and the decoding rows must be plain top-W
# (--block 0) up to Nk = 512K while the other tables keep the default block
# smoothing.
#   bash tests/cpu/test_dmattn_tables.sh build/flash_attn_mma
set -u
real=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build" "$tmp/out"
log="$tmp/rows.log"
cat >"$tmp/build/flash_attn_mma" <<EOF
#!/usr/bin/env bash
"$real" "\$@" --help >/dev/null
rc=\$?
echo "\$rc \$*" >>"$log"
exit \$rc
EOF
chmod +x "$tmp/build/flash_attn_mma"
BUILD_DIR="$tmp/build" DMATTN_OUT="$tmp/out" bash "$root/scripts/dmattn_tables" >"$tmp/stdout" 2>&1

passed=0
failed=0
check() {  # check "what" CONDITION...
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $what"; fi
}
rows=$(grep -v -- ' --list' "$log" 2>/dev/null)
table_rows() { printf '%s\n' "$rows" | grep -- "--csv $tmp/out/$1.csv"; }

check "the script ran rows" [ -n "$rows" ]
bad=$(printf '%s\n' "$rows" | grep -v '^0 ')
check "every row parses (bad: $bad)" [ -z "$bad" ]
for t in train:8 window:11 decode:8 ones:2 bwd:8; do
  n=$(table_rows "${t%%:*}" | grep -c '')
  check "${t%%:*}: ${t##*:} rows, got $n" [ "$n" -eq "${t##*:}" ]
done
decode=$(table_rows decode)
check "decode rows are plain top-W (--block 0)" [ "$(printf '%s\n' "$decode" | grep -c -- '--block 0 ')" -eq 8 ]
check "decode reaches Nk = 524288" grep -q -- '--Nq 1 --Nk 524288 ' <<<"$decode"
check "decode rows are causal top-1024 with a bias" \
  [ "$(printf '%s\n' "$decode" | grep -- '--causal' | grep -- '--mask topk --window 1024' | grep -c -- '--bias')" -eq 8 ]
check "every row also runs the bit-packed mask (--mask-bits)" [ -z "$(printf '%s\n' "$rows" | grep -v -- '--mask-bits')" ]
others=$(table_rows train; table_rows window; table_rows bwd)
check "train, window and bwd keep the default block smoothing" bash -c '! grep -q -- "--block" <<<"$1"' _ "$others"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || { echo "--- script output"; cat "$tmp/stdout"; exit 1; }
