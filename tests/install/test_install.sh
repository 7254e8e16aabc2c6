#!/usr/bin/env bash
# test_install.sh BUILD_DIR SRC_DIR WORK_DIR MODE
#   MODE install:       cmake --install BUILD_DIR into WORK_DIR/prefix, then build
#                       tests/install/consumer.c against it with pkg-config and
#                       with find_package(cohort CONFIG), run both, and import the
#                       installed Python package (it must load the installed
#                       library, no COHORT_LIBRARY).
#   MODE subdirectory:  build the consumer with cohort as add_subdirectory().
set -euo pipefail
build=$1 src=$2 work=$3 mode=$4
here="$src/tests/install"
rm -rf "$work"
mkdir -p "$work"
# A world of one, whatever the environment of the test run says.
unset COHORT_RANK COHORT_WORLD_SIZE COHORT_STORE COHORT_STORE_FD RANK WORLD_SIZE COHORT_LIBRARY
export COHORT_NICS=lo
case "$mode" in
install)
  prefix="$work/prefix"
  cmake --install "$build" --prefix "$prefix" >"$work/install.log"
  for f in include/cohort.h include/cohort_ffi.h lib/libcohort.so lib/pkgconfig/cohort.pc \
           lib/cmake/cohort/cohortConfig.cmake bin/cohortrun bin/cohort-bench \
           lib/python3/dist-packages/cohort/__init__.py lib/python3/dist-packages/cohort/_paths.py; do
    [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
  done
  # 1. pkg-config
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  ${CC:-cc} -o "$work/consumer-pc" "$here/consumer.c" $(pkg-config --cflags --libs cohort) \
    -Wl,-rpath,"$prefix/lib"
  "$work/consumer-pc"
  # 2. find_package(cohort CONFIG)
  cmake -S "$here/consumer" -B "$work/cm" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cm.log"
  cmake --build "$work/cm" >>"$work/cm.log"
  "$work/cm/consumer"
  # 3. the Python package finds the library it was installed with
  PYTHONPATH="$prefix/lib/python3/dist-packages" /usr/bin/python3 - "$prefix" <<'PY'
import sys, os, numpy as np, cohort
prefix = sys.argv[1]
p = cohort.library_path()
assert p.startswith(prefix), (p, prefix)
with cohort.init():
    a = np.arange(4, dtype=np.float32)
    cohort.allreduce(a)
    assert list(a) == [0, 1, 2, 3]
print("python: OK,", p)
PY
  ;;
subdirectory)
  cmake -S "$here/consumer" -B "$work/sub" -DCOHORT_SOURCE_DIR="$src" >"$work/sub.log"
  cmake --build "$work/sub" --target consumer -j"$(nproc)" >>"$work/sub.log"
  "$work/sub/consumer"
  ;;
*) echo "usage: $0 BUILD_DIR SRC_DIR WORK_DIR install|subdirectory"; exit 2 ;;
esac
echo "install test ($mode): OK"
