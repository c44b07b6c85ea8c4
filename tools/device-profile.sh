#!/usr/bin/env bash
# Nsight Compute over the transfer kernels, for the device minutes left after a
# `device-validate.sh run` (about 3 minutes): every decode launch of `bench_transfer --kernels
# --reps 1` (its 12 rows, 10 launches each, spread and ahead alternating: kivi-8, kivi-4, kivi-2
# and fp8 into NHD pages of 16 and 256 tokens, then each into HND pages) and the gather/scatter
# kernel's launches of its NHD and HND rows (16 each: scatter, gather, then both as `ahead`, for
# pages of 16 and 256 tokens), with the sections that say whether a
# launch waits on memory, on its instruction issue or on too few warps. The build is
# device-validate.sh's: run it on the GPU machine with .devrun/ carried,
#   bash tools/device-profile.sh          (OUT: the folder that comes back; BUDGET: seconds, 200)
# It writes $OUT/summary.txt, $OUT/ncu_decode.csv.gz and $OUT/ncu_copy.csv.gz (one row per
# launch and metric as `ncu --csv` prints them, the benchmark's own lines among them) and ncu's
# messages in $OUT/ncu_*.err. `python3 tools/ncu_table.py OUT/ncu_decode.csv.gz --bench decode`
# (and copy) makes them a table, a line per row and launch kind.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
run=$top/.devrun
W=/tmp/swiftkv-gpu
OUT=${OUT:-/tmp/swiftkv-out}
budget=${BUDGET:-200}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: > "$summary"
if [ ! -x "$W/proj/build/bench/bench_transfer" ]; then
  [ -f "$run/payload.tgz" ] || { echo "no .devrun/payload.tgz: device-validate.sh prepare first" | tee -a "$summary"; exit 1; }
  mkdir -p "$W" && tar -C "$W" -xzf "$run/payload.tgz" || exit 1
fi
export LD_LIBRARY_PATH=$run/libs:${LD_LIBRARY_PATH:-}
bench=$W/proj/build/bench/bench_transfer
command -v ncu > /dev/null || { echo "no ncu on this machine" | tee -a "$summary"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> "$summary" 2>&1
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy
  --section LaunchStats --section WarpStateStats --section SchedulerStats)
start=$SECONDS
# profile NAME REGEX COUNT: the first COUNT launches of the kernels matching REGEX, within what
# is left of the budget.
profile() {
  local name=$1 regex=$2 count=$3
  local left=$((budget - (SECONDS - start) - 10))
  if [ "$left" -lt 30 ]; then echo "$name: skipped, out of time" >> "$summary"; return; fi
  local t0=$SECONDS
  timeout "$left" ncu --clock-control none --kernel-name "regex:$regex" --launch-skip 0 \
    --launch-count "$count" "${sections[@]}" --csv "$bench" --kernels --reps 1 \
    > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
  local rc=$?
  local launches
  launches=$(grep -c '"Duration"' "$OUT/ncu_$name.csv" 2> /dev/null)
  echo "$name: rc=$rc, $launches launches profiled in $((SECONDS - t0)) s" >> "$summary"
  gzip -f "$OUT/ncu_$name.csv"
}
profile decode 'decode_items' "${DECODE_LAUNCHES:-120}"
profile copy 'copy_items' "${COPY_LAUNCHES:-64}"
cat "$summary"
