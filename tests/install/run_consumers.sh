#!/usr/bin/env bash
# Installs the build into a fresh staging prefix, then builds and runs a C consumer through
# pkg-config and a C++ consumer through find_package(swiftkv), neither seeing the source tree.
# Usage: run_consumers.sh BUILD_DIR SOURCE_DIR WORK_DIR CMAKE C_COMPILER CXX_COMPILER
set -euo pipefail
build=$1 src=$2 work=$3 cmake=$4 cc=$5 cxx=$6
rm -rf "$work"
stage=$work/stage
"$cmake" --install "$build" --prefix "$stage" >/dev/null

pc=$(find "$stage" -name swiftkv.pc -print -quit)
[ -n "$pc" ] || { echo "swiftkv.pc was not installed"; exit 1; }
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir swiftkv)
[ -e "$libdir/libswiftkv.so.0" ] || { echo "pkg-config libdir $libdir has no libswiftkv.so.0"; exit 1; }

echo "== pkg-config sees only swiftkv.pc (the library's own dependencies are private)"
empty=$work/no-pc && mkdir -p "$empty"
flags=$(PKG_CONFIG_LIBDIR=$empty PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs swiftkv)
case "$flags" in
  *xxhash*|*zmq*|*numa*) echo "private dependencies leak into '$flags'"; exit 1 ;;
esac

echo "== the installed swiftkv-bench runs without LD_LIBRARY_PATH"
if [ -x "$stage/bin/swiftkv-bench" ]; then
  env -u LD_LIBRARY_PATH "$stage/bin/swiftkv-bench" plan --help >/dev/null
fi

echo "== the UCX helper sits where the installed library looks for it"
if [ -x "$build/capi/swiftkv-ucx-helper" ]; then
  lib=$(find "$stage" -name 'libswiftkv.so.0' -print -quit)
  helper=$(dirname "$lib")/../libexec/swiftkv/swiftkv-ucx-helper
  [ -x "$helper" ] || { echo "no executable $helper"; exit 1; }
  # Started by hand it refuses with 2: it runs, and its libraries resolve.
  rc=0
  "$helper" >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { echo "the installed helper exits $rc"; exit 1; }
fi

echo "== a library built with FlashInfer installs its license and notice"
if [ -e "$build/third-party/flashinfer/NOTICE" ]; then
  doc=$(find "$stage" -path '*doc/swiftkv/third-party/flashinfer' -type d -print -quit)
  [ -n "$doc" ] || { echo "no doc/swiftkv/third-party/flashinfer in the install"; exit 1; }
  grep -q "Apache License" "$doc/LICENSE" || { echo "no FlashInfer LICENSE in $doc"; exit 1; }
  grep -q "FlashInfer" "$doc/NOTICE" || { echo "no NOTICE in $doc"; exit 1; }
fi

echo "== C consumer through pkg-config"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -pedantic -Werror "$src/tests/install/consumer.c" -o "$work/c_consumer" \
  $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs swiftkv) -Wl,-rpath,"$libdir"
"$work/c_consumer"

echo "== C++ consumer through find_package"
"$cmake" -S "$src/tests/install/cxx_consumer" -B "$work/cxx" -DCMAKE_PREFIX_PATH="$stage" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_RPATH="$libdir" >/dev/null
"$cmake" --build "$work/cxx" >/dev/null
"$work/cxx/cxx_consumer"
