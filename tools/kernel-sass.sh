#!/usr/bin/env bash
# The transfer kernels' machine code on this machine, no GPU needed: registers and spills of each
# kernel for sm_80, sm_89 and sm_90 (ptxas -v), and for one kernel the instruction counts of its
# inner loops' paths on sm_90 (tools/sass_paths.py, nvdisasm from PyPI in a cached venv). How the
# decoder's instruction counts in docs/codecs.md were taken.
#   tools/kernel-sass.sh [KERNEL]     KERNEL: a part of a kernel's mangled name (12decode_items)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kernel=${1:-12decode_items}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
src=$root/core/transfer/cuda_transfer.cu
flags=(-I"$root" -I"$root/include" -O2 -DNDEBUG -std=c++17 -x cu)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for arch in 80 89 90; do
  "$nvcc" "${flags[@]}" --generate-code=arch=compute_$arch,code=sm_$arch -c -Xptxas=-v \
    -o /dev/null "$src" 2>&1 |
    awk -v a="$arch" '/Compiling entry/ { match($0, /_ZN[^'"'"']*/); k = substr($0, RSTART, RLENGTH) }
      /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); r = substr($0, RSTART, RLENGTH) }
      /spill stores/ { match($0, /[0-9]+ bytes spill stores/); s = substr($0, RSTART, RLENGTH) }
      /Used [0-9]+ registers/ { print "sm_" a, k, r ", " s }'
done
venv=$(bash "$root/tools/venv.sh" sass "$root/tools/sass-requirements.txt" /usr/bin/python3)
nvdisasm=$(find "$venv" -name nvdisasm -type f | head -1)
"$nvcc" "${flags[@]}" --generate-code=arch=compute_90,code=sm_90 -cubin -o "$work/k.cubin" "$src"
"$nvdisasm" -c "$work/k.cubin" > "$work/k.sass"
echo "sm_90 $kernel: inner loops"
python3 "$root/tools/sass_paths.py" "$work/k.sass" "$kernel"
