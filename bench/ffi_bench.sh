#!/usr/bin/env bash
# bench/ffi_bench.sh [BUILD_DIR]: the ABI's cost, side by side in one run (the
# machine is shared: compare figures of the same run only).
#   1. cohort-ffi-bench, world of 1 and of 2: codec, submission, blocking
#      allreduce of 4 KiB and 64 MiB from C vs through the ABI;
#   2. the same allreduces from Python (ffi/python/bench/allreduce_bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build}
run="$b/bin/cohortrun"
export COHORT_LIBRARY="$PWD/$b/lib/libcohort.so" PYTHONPATH="$PWD/ffi/python"
echo "== C: world of 1"
"$b/bin/cohort-ffi-bench"
echo "== C: world of 2"
"$run" -n 2 --no-prefix -- "$b/bin/cohort-ffi-bench"
echo "== python: world of 1"
/usr/bin/python3 ffi/python/bench/allreduce_bench.py
echo "== python: world of 2"
"$run" -n 2 --no-prefix -- /usr/bin/python3 ffi/python/bench/allreduce_bench.py
