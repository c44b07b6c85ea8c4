#!/usr/bin/env bash
# One short GPU check of this session's fixes: the stream-pages ordering under the sanitizers,
# the Python GPU tests, the pipeline rows with the compute measured, and the copy kernels
# profiled.
set -u
here=$(cd "$(dirname "$0")" && pwd)
W=/tmp/swiftkv-gpu
mkdir -p "$W" && tar -C "$W" -xzf "$here/payload.tgz" || exit 1
export LD_LIBRARY_PATH=$here/libs:${LD_LIBRARY_PATH:-}
B=$W/proj/build
S=$OUT/summary.txt
log() { echo "$*" | tee -a "$S"; }
cd "$B/tests"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
for i in 1 2 3; do
  SWIFTKV_REQUIRE_GPU=1 timeout 60 ./test_gpu_connector > "$OUT/conn$i.log" 2>&1; log "test_gpu_connector run $i rc=$? $(grep -c 'FAILED\|check failed' "$OUT/conn$i.log") failures"
done
cs="compute-sanitizer --error-exitcode 99"
SWIFTKV_REQUIRE_GPU=1 timeout 90 $cs --tool memcheck ./test_gpu_connector > "$OUT/memcheck.log" 2>&1; log "memcheck rc=$? $(grep 'ERROR SUMMARY\|PASSED\|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
SWIFTKV_REQUIRE_GPU=1 timeout 90 $cs --tool racecheck ./test_gpu_connector > "$OUT/racecheck.log" 2>&1; log "racecheck rc=$? $(grep 'RACECHECK SUMMARY\|PASSED\|FAILED' "$OUT/racecheck.log" | tr '\n' ' ')"
pyinc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
pkg=$W/py && rm -rf "$pkg" && mkdir -p "$pkg" && cp -r "$B/bindings/python/swiftkv" "$pkg/" && rm -f "$pkg"/swiftkv/_capi*.so
gcc -shared -fPIC -O2 -w -I"$pyinc" -I"$W/proj/include" "$B"/bindings/python/wrap/*.c -L"$B/capi" -lswiftkv -Wl,-rpath,"$B/capi" -o "$pkg/swiftkv/_capi.so" &&
  PYTHONPATH=$pkg timeout 100 python3 -m pytest -q -p no:cacheprovider "$W/proj/tests/python" > "$OUT/pytest.log" 2>&1
log "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
timeout 60 stdbuf -oL "$B/bench/bench_transfer" > "$OUT/bench_transfer.log" 2>&1; log "bench_transfer rc=$?"
grep -A8 'pipeline (cuda)' "$OUT/bench_transfer.log" | tee -a "$S"
timeout 100 ncu --clock-control none --kernel-name regex:'copy_items|decode_items' --launch-skip 0 --launch-count 32 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
  --csv "$B/bench/bench_transfer" --kernels --reps 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; log "ncu rc=$?"
