#!/bin/bash
# The README's first programs, run exactly as written: the C example compiled against the build
# tree's library, the Python one against its module. Both must print the line the README says.
# Usage: readme_examples.sh SOURCE_DIR BUILD_DIR C_COMPILER [PYTHON PYTHONPATH]
set -euo pipefail
src=$1 build=$2 cc=$3 python=${4:-} pypath=${5:-}
want="stored 512, found 512, loaded 512 tokens"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The fenced block after the marker comment "<!-- README example: LANG -->".
block() {
  awk -v marker="<!-- README example: $1 -->" '
    $0 == marker { armed = 1; next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$src/README.md"
}

block c > "$work/first.c"
[ -s "$work/first.c" ] || { echo "README.md has no C example"; exit 1; }
lib=$(dirname "$(find "$build/capi" -name 'libswiftkv.so' | head -1)")
"$cc" -std=c11 -Wall -Wextra -Werror -I "$src/include" "$work/first.c" -L "$lib" -lswiftkv \
  -Wl,-rpath,"$lib" -o "$work/first"
got=$(SWIFTKV_LOG=off "$work/first")
[ "$got" = "$want" ] || { echo "the C example printed '$got', the README says '$want'"; exit 1; }
echo "C example: $got"

if [ -n "$python" ]; then
  block python > "$work/first.py"
  [ -s "$work/first.py" ] || { echo "README.md has no Python example"; exit 1; }
  got=$(cd "$work" && SWIFTKV_LOG=off PYTHONPATH="$pypath" "$python" first.py)
  [ "$got" = "$want" ] || { echo "the Python example printed '$got', the README says '$want'"; exit 1; }
  echo "Python example: $got"
fi
