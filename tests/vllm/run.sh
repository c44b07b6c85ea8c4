#!/usr/bin/env bash
# ctest "vllm": pytest on the vLLM connector's tests (tests/vllm/test_*.py) in the venv
# tools/venv.sh makes from requirements.txt (vLLM and its torch from PyPI), with the build's
# Python package first on the path. vLLM's scheduler runs on the CPU; no model is downloaded
# or run.
#   run.sh PYTHON PACKAGE_DIR
set -euo pipefail
py=$1 pkg=$2
here=$(cd "$(dirname "$0")" && pwd)
venv=$("$here/../../tools/venv.sh" vllm "$here/requirements.txt" "$py")
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here"
