#!/usr/bin/env bash
# ctest "transformers": a venv over Debian's python3 with its system packages (python3-torch,
# numpy, pytest) plus the pinned transformers from PyPI (requirements.txt), kept in the build
# tree and reused while the pin is unchanged; then pytest on test_transformers.py with the
# build's Python package first on the path. No model weights are downloaded: the tests build
# their models from configs with random weights.
#   run.sh PYTHON PACKAGE_DIR VENV_DIR
set -euo pipefail
py=$1 pkg=$2 venv=$3
here=$(cd "$(dirname "$0")" && pwd)
stamp="$venv/.requirements"
if ! cmp -s "$here/requirements.txt" "$stamp" 2>/dev/null; then
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$stamp"
fi
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/test_transformers.py"
