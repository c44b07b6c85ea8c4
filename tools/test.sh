#!/usr/bin/env bash
# Builds libswiftkv and runs the whole test suite. The README's test command.
#   tools/test.sh                 default build in build/ (CUDA when nvcc is found), the bindings
#                                 (for Debian's /usr/bin/python3), all tests
#   tools/test.sh --asan          CPU build with ASan+UBSan in build-asan/, CPU tests
#   tools/test.sh --tsan          CPU build with TSan in build-tsan/, CPU tests
#   tools/test.sh --fuzz          clang build of the libFuzzer targets in build-fuzz/, each fuzz_*
#                                 test for SWIFTKV_FUZZ_SECONDS (default 30; 600 for a long run)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash tools/deps.sh

mode=${1:-}
case "$mode" in
  "")     dir=build;      flags=(-DSWIFTKV_BUILD_BINDINGS=ON -DPython3_EXECUTABLE=/usr/bin/python3) ;;
  --asan) dir=build-asan; flags=(-DSWIFTKV_ENABLE_ASAN=ON -DSWIFTKV_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug) ;;
  --tsan) dir=build-tsan; flags=(-DSWIFTKV_ENABLE_TSAN=ON -DSWIFTKV_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug) ;;
  --fuzz) dir=build-fuzz
          flags=(-DSWIFTKV_BUILD_FUZZ=ON -DSWIFTKV_BUILD_TESTS=OFF -DSWIFTKV_WITH_CUDA=OFF
                 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14
                 -DCMAKE_CXX_COMPILER=clang++-14
                 "-DSWIFTKV_FUZZ_SECONDS=${SWIFTKV_FUZZ_SECONDS:-30}") ;;
  *) echo "usage: tools/test.sh [--asan|--tsan|--fuzz]" >&2; exit 2 ;;
esac

cmake -S . -B "$dir" -G Ninja -DSWIFTKV_BUILD_TESTS=ON -DSWIFTKV_BUILD_BENCH=ON -DSWIFTKV_WERROR=ON \
  "${flags[@]}"
cmake --build "$dir" -j "$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$top/tests/tsan.supp}
# UCX's memory hooks (libucm) patch mmap and madvise to see memory go away; glibc calls madvise
# while a thread ends, where TSan's state for that thread is already gone, and TSan's interceptor
# in the hook crashes. The hooks only feed UCX's registration cache, which the tcp transport of
# the tests does not use: off under TSan.
if [ "$dir" = build-tsan ]; then export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-none}; fi
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)"
