#!/usr/bin/env bash
# Makes (once) and prints the path of the venv with the stack Python users run: torch 2 and
# transformers 5 from PyPI, pinned in requirements.txt (about 3.5 GB to download, 5.6 GB
# installed, a few minutes), cached as tools/venv.sh says. Shared by the transformers tests
# (run.sh) and the two-model example (examples/two_models/run.sh).
#   venv.sh PYTHON
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../../tools/venv.sh" transformers "$here/requirements.txt" "$1"
