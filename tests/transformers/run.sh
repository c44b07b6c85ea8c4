#!/usr/bin/env bash
# ctest "transformers": pytest on the transformers integration's tests and the two-model example
# (tests/transformers/test_*.py) in the venv venv.sh makes (torch 2 and transformers 5 from PyPI),
# with the build's Python package first on the path. No model weights are downloaded: the tests
# build their models from configs with random weights.
#   run.sh PYTHON PACKAGE_DIR
set -euo pipefail
py=$1 pkg=$2
here=$(cd "$(dirname "$0")" && pwd)
venv=$("$here/venv.sh" "$py")
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/test_transformers.py" \
  "$here/test_two_models.py"
