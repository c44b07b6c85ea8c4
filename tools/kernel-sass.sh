#!/usr/bin/env bash
# The transfer kernels' machine code on this machine, no GPU needed: registers and spills of each
# kernel for sm_80, sm_89 and sm_90 (ptxas -v), and for one kernel the instruction counts of its
# inner loops' paths on sm_90 (tools/sass_paths.py, nvdisasm from PyPI in a cached venv). How the
# decoder's instruction counts in docs/codecs.md were taken, and the copy kernel's per item
# (10copy_items: its loop over items, one path per way an item goes) in the CHANGELOG.
#   tools/kernel-sass.sh [KERNEL]     KERNEL: a part of a kernel's mangled name (12decode_items)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kernel=${1:-12decode_items}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
src=$root/core/transfer/cuda_transfer.cu
flags=(-I"$root" -I"$root/include" -O2 -g -DNDEBUG -std=c++17 -x cu)  # the library's build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for arch in 80 89 90; do
  "$nvcc" "${flags[@]}" --generate-code=arch=compute_$arch,code=sm_$arch -c -Xptxas=-v \
    -o /dev/null "$src" 2>&1 | python3 -c '
import re, sys
# ptxas -v: "Function properties for NAME" then its stack and spills, then "Used N registers" for
# a kernel; a device function the compiler did not inline has no registers line of its own.
arch, rows, name = sys.argv[1], [], None
for line in sys.stdin:
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        name = m.group(1)
        rows.append([name, "", "function"])
    m = re.search(r"(\d+) bytes spill stores", line)
    if m and rows:
        rows[-1][1] = m.group(1) + " bytes spill stores"
    m = re.search(r"Used (\d+) registers", line)
    if m and rows:
        rows[-1][2] = m.group(1) + " registers"
for name, spill, regs in rows:
    print(f"sm_{arch} {name}: {regs}, {spill}")
' "$arch"
done
venv=$(bash "$root/tools/venv.sh" sass "$root/tools/sass-requirements.txt" /usr/bin/python3)
nvdisasm=$(find "$venv" -name nvdisasm -type f | head -1)
"$nvcc" "${flags[@]}" --generate-code=arch=compute_90,code=sm_90 -cubin -o "$work/k.cubin" "$src"
"$nvdisasm" -c "$work/k.cubin" > "$work/k.sass"
echo "sm_90 $kernel: inner loops"
python3 "$root/tools/sass_paths.py" "$work/k.sass" "$kernel"
