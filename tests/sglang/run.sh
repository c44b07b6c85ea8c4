#!/usr/bin/env bash
# ctest "sglang": pytest on the HiCache storage backend (test_sglang_*.py) against SGLang's own
# host pools, backend factory and cache controller code on the CPU, in the venv tools/venv.sh
# makes from requirements.txt and requirements.nodeps.txt (SGLang 0.5.23 and its torch from
# PyPI), with the build's Python package first on the path.
#   run.sh PYTHON PACKAGE_DIR
set -euo pipefail
py=$1 pkg=$2
here=$(cd "$(dirname "$0")" && pwd)
venv=$("$here/../../tools/venv.sh" sglang "$here/requirements.txt" "$py")
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here"
