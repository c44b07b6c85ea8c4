#!/usr/bin/env bash
# Builds libswiftkv and runs the main job: swiftkv-bench replay on its built-in default workload.
# Arguments are passed to swiftkv-bench (try --help).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash tools/deps.sh
cmake -S . -B build -G Ninja -DSWIFTKV_BUILD_BENCH=ON >/dev/null
cmake --build build -j "$(nproc)" --target swiftkv-bench >/dev/null
exec build/tools/swiftkv-bench "$@"
