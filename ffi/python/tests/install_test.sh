#!/usr/bin/env bash
# pip-install the package from a copy of the source tree into a fresh venv
# (--system-site-packages: numpy and msgpack come from Debian), then import
# it from elsewhere, with no COHORT_LIBRARY: it must load the library it was
# built with, and run a collective in a world of one.
#   install_test.sh PYTHON SRC_DIR WORK_DIR LIBCOHORT
set -euo pipefail
py=$1 src=$2 work=$3 lib=$4
rm -rf "$work"
mkdir -p "$work"
cp -r "$src" "$work/src"
rm -rf "$work/src/tests" "$work/src/build" "$work/src"/*.egg-info
"$py" -m venv --system-site-packages "$work/venv"
COHORT_LIBRARY="$lib" "$work/venv/bin/python" -m pip install -q --no-deps --no-build-isolation \
  --no-index "$work/src"
cd "$work"
env -u COHORT_LIBRARY -u PYTHONPATH -u COHORT_RANK -u COHORT_WORLD_SIZE -u COHORT_STORE \
  -u COHORT_STORE_FD "$work/venv/bin/python" - <<'PY'
import os, numpy as np, cohort
p = cohort.library_path()
assert "site-packages" in p and p.endswith("_lib/libcohort.so"), p
with cohort.init() as ctx:
    a = np.arange(4, dtype=np.float32)
    cohort.allreduce(a)
    assert list(a) == [0, 1, 2, 3]
print("installed package OK:", p)
PY
"$work/venv/bin/python" -m pip uninstall -q -y cohort
