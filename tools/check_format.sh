#!/usr/bin/env bash
# Fails when a C, C++ or CUDA source differs from what clang-format makes of it with the
# committed .clang-format. Pinned to clang-format 14 (Debian 12's): other versions lay some
# constructs out differently. Usage: check_format.sh [CLANG_FORMAT]
# To apply: tools/check_format.sh --fix
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
fix=0
if [ "${1:-}" = "--fix" ]; then fix=1; shift; fi
cf=${1:-clang-format-14}
cd "$top"
mapfile -t files < <(find bench capi core fuzz include kernels tests tools examples \
  -type f \( -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' \
  -o -name '*.cuh' \) 2>/dev/null | sort)
if [ "$fix" = 1 ]; then
  "$cf" -i "${files[@]}"
else
  "$cf" --dry-run --Werror "${files[@]}"
fi
