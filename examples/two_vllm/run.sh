#!/usr/bin/env bash
# The two-vLLM-engine example in one command, after the README's set-up (which builds into build/
# and makes the venv of vLLM's CPU build): examples/two_vllm/run.sh [BUILD_DIR] [two_vllm.py
# options]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  build=$1
  shift
fi
if [ ! -d "$build/bindings/python/swiftkv" ]; then
  echo "run.sh: no Python package in $build/bindings/python: build first (see the README)" >&2
  exit 2
fi
venv=$("$root/tools/venv.sh" vllm-engine "$root/tests/vllm_engine/requirements.txt" /usr/bin/python3)
export PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" "$here/two_vllm.py" "$@"
