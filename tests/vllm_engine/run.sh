#!/usr/bin/env bash
# ctest "vllm_engine": pytest on the connector inside a real vLLM engine on the CPU
# (test_vllm_*.py), in the venv tools/venv.sh makes from requirements.txt and
# requirements.nodeps.txt (vLLM's CPU build and its dependencies from PyPI), with the build's
# Python package first on the path. A small Llama with random weights; nothing is downloaded.
#   run.sh PYTHON PACKAGE_DIR
set -euo pipefail
py=$1 pkg=$2
here=$(cd "$(dirname "$0")" && pwd)
venv=$("$here/../../tools/venv.sh" vllm-engine "$here/requirements.txt" "$py")
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here"
