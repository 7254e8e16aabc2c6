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
try:
    import torch
except ImportError:
    torch = None
if torch is not None and any(f.startswith("_c10d") for f in os.listdir(os.path.dirname(p))):
    import torch.distributed as dist, cohort.torch
    assert "site-packages" in cohort.torch.extension_path(), cohort.torch.extension_path()
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.init_process_group("cohort", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    print("installed torch backend OK:", cohort.torch.extension_path())
PY
"$work/venv/bin/python" -m pip uninstall -q -y cohort
