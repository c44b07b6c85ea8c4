#!/usr/bin/env bash
# ctest bench_replay_stopped: a replay stopped by SIGTERM while its disk tier holds files exits
# 128 + 15 and leaves nothing under --work-dir (a killed replay once left thousands of files).
#   replay_stop.sh SWIFTKV_BENCH WORK_DIR
set -euo pipefail
bench=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
# Large enough to still be running after its disk tier has files; only the disk policies.
"$bench" replay --sessions 4000 --policies swiftkv,hierarchical --no-progress \
  --work-dir "$work/tier" --out-dir "$work/out" >/dev/null 2>"$work/stderr" &
pid=$!
for _ in $(seq 1 1200); do
  if compgen -G "$work/tier/swiftkv-replay-*/*" >/dev/null; then break; fi
  sleep 0.05
done
compgen -G "$work/tier/swiftkv-replay-*/*" >/dev/null || { echo "the disk tier never had files"; kill $pid; exit 1; }
kill -TERM $pid
rc=0
wait $pid || rc=$?
cat "$work/stderr"
[ "$rc" -eq 143 ] || { echo "exit status $rc, not 143"; exit 1; }
left=$(find "$work/tier" -mindepth 1 | head -5)
[ -z "$left" ] || { echo "left behind: $left"; exit 1; }
echo "stopped cleanly"
