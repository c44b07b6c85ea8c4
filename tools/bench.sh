#!/usr/bin/env bash
# Builds libswiftkv and runs the main job: swiftkv-bench replay on its built-in default workload.
# Arguments are passed to swiftkv-bench (try --help).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash tools/deps.sh
# Say what the silent minutes are (the first build compiles the library, CUDA included where
# nvcc is found); the build's own output only when it fails.
if [ ! -x build/tools/swiftkv-bench ]; then
  echo "bench.sh: building swiftkv-bench in build/ (the first build takes a few minutes)" >&2
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { cmake -S . -B build -G Ninja -DSWIFTKV_BUILD_BENCH=ON &&
       cmake --build build -j "$(nproc)" --target swiftkv-bench; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "bench.sh: the build failed (above)" >&2
  exit 1
fi
rm -f "$log"
trap - EXIT
exec build/tools/swiftkv-bench "$@"
