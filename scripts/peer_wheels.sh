#!/usr/bin/env bash
# The peers' wheels (pyproject's `peers` extra: FlashAttention-4 and the CUTLASS DSL) for a
# machine without the package index, carried over in pieces a file transfer takes.
#   scripts/peer_wheels.sh fetch DIR     # here, with the index: the wheels for Python 3.12 on
#                                        # x86-64 Linux, each over 31 MB split into DIR/parts/
#   scripts/peer_wheels.sh install DIR   # there: the parts joined, then pip install --no-deps of
#                                        # every wheel whose package is not installed yet (torch's
#                                        # own cuda-bindings, protobuf, ... are left as they are)
# The pins are pyproject.toml's; the rest are what those wheels require beyond torch. The
# device tool takes at most 64 MiB a call: carry the wheels in one call and one part in each
# of the next (the machine kept warm between them), each copied into the same DIR there
# (the wheels in DIR, the parts in DIR/parts), then install, or gpu_check.sh with PEER_WHEELS=DIR.
set -euo pipefail
mode=${1:-}
dir=${2:-}
[ -n "$dir" ] && { [ "$mode" = fetch ] || [ "$mode" = install ]; } ||
  { echo "usage: scripts/peer_wheels.sh fetch|install DIR" >&2; exit 2; }
part_bytes=31000000

if [ "$mode" = fetch ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  mapfile -t pins < <(python3 - "$root/pyproject.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"^peers = \[(.*?)^\]", text, re.S | re.M).group(1)
print("\n".join(re.findall(r'"([^"]+)"', block)))
PY
)
  extra=("cuda-bindings>=12.8" "cuda-pathfinder>=1.4.2" "protobuf>=4.21.12" "typing-extensions>=4.13")
  mkdir -p "$dir/parts"
  for spec in "${pins[@]}" "${extra[@]}"; do
    pip download --quiet --no-deps --only-binary=:all: --dest "$dir" --python-version 3.12 \
      --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any "$spec"
  done
  for w in "$dir"/*.whl; do
    if [ "$(stat -c %s "$w")" -gt $part_bytes ]; then
      split -b $part_bytes "$w" "$dir/parts/$(basename "$w")."
      rm "$w"
    fi
  done
  ls -l "$dir" "$dir/parts"
  exit 0
fi

# install: join the parts (NAME.whl.aa, .ab, ... in order), then the wheels not installed yet.
shopt -s nullglob
for first in "$dir"/parts/*.whl.aa; do
  whl=${first%.aa}
  cat "$whl".?? > "$dir/$(basename "$whl")"
done
todo=()
for w in "$dir"/*.whl; do
  name=$(basename "$w" | cut -d- -f1)
  if python3 -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null; then
    echo "already installed: $name"
  else
    todo+=("$w")
  fi
done
[ ${#todo[@]} -eq 0 ] || python3 -m pip install --no-index --no-deps "${todo[@]}"
python3 -c "from flash_attn.cute import flash_attn_func" && echo "flash_attn.cute imports"
