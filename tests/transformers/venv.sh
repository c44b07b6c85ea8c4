#!/usr/bin/env bash
# Makes (once) and prints the path of the venv with the stack Python users run: torch 2 and
# transformers 5 from PyPI, pinned in requirements.txt, over PYTHON (Debian's python3). Shared
# by the transformers tests (run.sh) and the two-model example (examples/two_models/run.sh).
#
# PyPI's torch comes with its CUDA libraries (about 3.5 GB to download, 5.6 GB installed, a few
# minutes), so the venv lives in a cache outside the build tree and is made again only when
# requirements.txt changes: under $SWIFTKV_VENV_CACHE, else ~/.cache/swiftkv. One venv is kept
# there; a venv of other requirements is removed when a new one is made.
#   venv.sh PYTHON
set -euo pipefail
py=$1
here=$(cd "$(dirname "$0")" && pwd)
cache=${SWIFTKV_VENV_CACHE:-${HOME:-/root}/.cache/swiftkv}
sum=$(sha256sum "$here/requirements.txt" | cut -c1-12)
venv="$cache/transformers-$sum"
mkdir -p "$cache"
exec 9>"$cache/.transformers.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  for old in "$cache"/transformers-*; do
    [ -d "$old" ] && [ "$old" != "$venv" ] && rm -rf "$old"
  done
  rm -rf "$venv"
  echo "venv.sh: making $venv (torch and transformers from PyPI, once)" >&2
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir \
    -r "$here/requirements.txt" >&2
  touch "$venv/.complete"
fi
flock -u 9
echo "$venv"
