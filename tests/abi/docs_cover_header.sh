#!/usr/bin/env bash
# ctest docs_cover_the_header: every function the public header exports (SWIFTKV_API) and every
# struct it defines is named in docs/api.md (or, for attention, docs/attention.md), so the
# reference cannot silently fall behind the header.
#   docs_cover_header.sh SOURCE_DIR
set -euo pipefail
src=$1
header=$src/include/swiftkv/swiftkv.h
docs=("$src/docs/api.md" "$src/docs/attention.md")
missing=0
funcs=$(grep -o 'SWIFTKV_API [^(]*swiftkv_[a-z0-9_]*(' "$header" | grep -o 'swiftkv_[a-z0-9_]*(' | tr -d '(' | sort -u)
structs=$(grep -o 'typedef struct swiftkv_[a-z0-9_]*' "$header" | awk '{print $3}' | sort -u)
[ -n "$funcs" ] && [ -n "$structs" ] || { echo "found no functions or structs in $header"; exit 1; }
for name in $funcs $structs; do
  if ! grep -qw "$name" "${docs[@]}"; then
    echo "not documented: $name"
    missing=$((missing + 1))
  fi
done
[ "$missing" -eq 0 ] || exit 1
echo "$(echo "$funcs" | wc -w) functions and $(echo "$structs" | wc -w) structs documented"
