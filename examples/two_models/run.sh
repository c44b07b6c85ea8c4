#!/usr/bin/env bash
# The two-model example in one command, after the README's set-up (which builds into build/ and
# makes the torch/transformers venv): examples/two_models/run.sh [BUILD_DIR] [two_models.py options]
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
venv=$("$root/tests/transformers/venv.sh" /usr/bin/python3)
export PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" "$here/two_models.py" "$@"
