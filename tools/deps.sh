#!/usr/bin/env bash
# Installs what building and testing libswiftkv needs from Debian's archive. Idempotent: when
# every package is already there it changes nothing and needs no network. Needs root (or sudo).
# CUDA is not a Debian package here: when /usr/local/cuda/bin/nvcc exists the build uses it.
set -euo pipefail
pkgs=(cmake ninja-build g++ gcc pkg-config binutils libcmocka-dev libnuma-dev libzmq3-dev
      libxxhash-dev libzstd-dev libucx-dev ucx-utils iproute2 nlohmann-json3-dev python3
      swig python3-dev python3-numpy python3-pytest python3-torch python3-venv python3-pip
      python3-prometheus-client
      cargo rustc bindgen golang-go
      clang-14 libclang-rt-14-dev clang-format-14)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps.sh: run as root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
