#!/usr/bin/env bash
# ctest python_pip_install: `pip install .` of a clean copy of the sources into a fresh venv (no
# system packages; numpy and scikit-build-core come from PyPI), then `import swiftkv` from
# outside any source or build tree, and one store and lookup through the installed module.
#   pip_install_test.sh SOURCE_DIR WORK_DIR PYTHON
set -euo pipefail
src=$1 work=$2 py=$3
rm -rf "$work"
mkdir -p "$work/src"
# The tracked files only, as a clean clone has them (plus uncommitted edits to them).
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard \
    | (cd "$src" && xargs -0 cp --parents -t "$work/src" 2>/dev/null || true)
else
  cp -r "$src/." "$work/src"
  rm -rf "$work"/src/build*
fi
"$py" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$work/src"
cd "$work"
rm -rf "$work/src"  # nothing of the sources may be needed any more
"$work/venv/bin/python" - "$work/venv" <<'PY'
import os, sys
import numpy as np
import swiftkv

venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(swiftkv.__file__)
assert where.startswith(venv + os.sep), f"swiftkv imported from {where}, not from the venv"
libs = [f for f in os.listdir(os.path.dirname(where)) if f.startswith("libswiftkv.so")]
assert libs == ["libswiftkv.so.0"], libs
# The lender's UCX helper, where the library looks for it (a wheel built with UCX has one).
helper = os.path.join(os.path.dirname(where), "swiftkv-ucx-helper")
if os.environ.get("SWIFTKV_EXPECT_UCX_HELPER") == "1":
    assert os.access(helper, os.X_OK), f"no executable {helper}"
m = swiftkv.ModelDesc("pip", num_layers=2, num_kv_heads=2, head_dim=8, chunk_tokens=16)
with swiftkv.Context(host_budget_bytes=1 << 20) as ctx:
    model = ctx.register_model(m)
    tokens = np.arange(32, dtype=np.uint32)
    kv = np.arange(2 * m.chunk_bytes, dtype=np.uint32).astype(np.uint8)
    assert model.store(tokens, kv) == 32
    back = np.zeros_like(kv)
    assert model.retrieve(tokens, 0, back) == 32
    assert (back == kv).all()
print("pip install ok:", swiftkv.version_string(), where)
PY
