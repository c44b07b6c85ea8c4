#!/usr/bin/env bash
# Makes (once) and prints the path of a venv of pinned PyPI packages over PYTHON (Debian's
# python3), for the tests of an integration whose stack only PyPI has (torch 2, transformers 5,
# vLLM). PyPI's torch comes with its CUDA libraries (gigabytes), so the venv lives in a cache
# outside the build tree, named NAME-<hash of REQUIREMENTS>, and is made again only when the
# requirements change: under $SWIFTKV_VENV_CACHE, else ~/.cache/swiftkv. One venv of each NAME is
# kept there; one of other requirements is removed when a new one is made.
#   venv.sh NAME REQUIREMENTS PYTHON
set -euo pipefail
name=$1 req=$2 py=$3
cache=${SWIFTKV_VENV_CACHE:-${HOME:-/root}/.cache/swiftkv}
sum=$(sha256sum "$req" | cut -c1-12)
venv="$cache/$name-$sum"
mkdir -p "$cache"
exec 9>"$cache/.$name.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  for old in "$cache/$name"-*; do
    [ -d "$old" ] && [ "$old" != "$venv" ] && rm -rf "$old"
  done
  rm -rf "$venv"
  echo "venv.sh: making $venv (from PyPI, once: $(grep -v '^#' "$req" | tr '\n' ' '))" >&2
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r "$req" >&2
  touch "$venv/.complete"
fi
flock -u 9
echo "$venv"
