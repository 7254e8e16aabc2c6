#!/usr/bin/env bash
# tools/test.sh - the whole test suite, from a fresh machine:
#   1. install missing Debian packages
#   2. gcc build (RelWithDebInfo, -Werror) and every CTest: unit (cmocka),
#      multi-process (cohortrun), scheduler and simulator, namespace cluster,
#      Python (pytest), install and add_subdirectory, the layering check
#   3. the build matrix, compile only: Debug, RelWithDebInfo and Release with
#      gcc and clang, -Werror (a warning any of them finds fails CI; users'
#      builds keep -Werror off)
#   4. ASan + UBSan build and every CTest again
#   5. TSan build and the tests that exercise the reactors' threads
#   6. fuzz targets (clang, libFuzzer) for a short fixed time each, when present
#   7. the Julia package's tests, when a julia binary is on PATH
# Environment: COHORT_TEST_SKIP="asan tsan matrix fuzz" skips stages (local use
# only; CI runs everything). COHORT_TEST_JOBS sets ctest's parallelism (2).
set -euo pipefail
cd "$(dirname "$0")/.."
skip=" ${COHORT_TEST_SKIP:-} "
jobs=${COHORT_TEST_JOBS:-2}
t_all=$(date +%s)
stage() { printf '\n=== %s ===\n' "$*"; }
skipped() { [[ "$skip" == *" $1 "* ]]; }
run_ctest() { # dir, ctest args...
  local dir=$1; shift
  (cd "$dir" && ctest --output-on-failure -j"$jobs" --timeout 900 "$@")
}

stage "dependencies"
COHORT_DEPS_TORCH=1 tools/install-deps.sh

stage "gcc build"
tools/build.sh build -DCOHORT_WERROR=ON
stage "tests (gcc build)"
run_ctest build -LE flaky
# Known flaky tests (label "flaky": the relay kill/stop trials and fault runs,
# cluster.load): run and reported, not gating, until their defects are fixed.
stage "known flaky tests (gcc build; reported, not gating)"
if run_ctest build -L flaky; then
  echo "known flaky tests: all passed this time"
else
  echo "KNOWN FLAKY: a test labelled flaky failed (docs/relay.md, docs/load.md \"Open\")"
fi

if ! skipped matrix; then
  for cc in gcc clang; do
    for bt in Debug RelWithDebInfo Release; do
      [ "$cc/$bt" = gcc/RelWithDebInfo ] && continue # built above
      stage "$cc $bt build (-Werror, compile only)"
      cxx=g++
      [ $cc = clang ] && cxx=clang++
      # the torch backend (30 s of torch headers) once more, with clang
      torch=OFF
      [ $cc/$bt = clang/RelWithDebInfo ] && torch=AUTO
      CC=$cc CXX=$cxx tools/build.sh "build-$cc-$bt" -DCMAKE_BUILD_TYPE=$bt -DCOHORT_WERROR=ON \
        -DCOHORT_BENCH_PEERS=OFF -DCOHORT_TORCH=$torch
    done
  done
fi

if ! skipped asan; then
  stage "ASan + UBSan build"
  tools/build.sh build-asan -DCOHORT_WERROR=ON -DCOHORT_ASAN=ON -DCOHORT_BENCH_PEERS=OFF -DCOHORT_CUDA=OFF
  stage "tests (ASan + UBSan)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest build-asan -E '^(sim\.sweep|mp\.relay\.trials)' -LE flaky
fi

if ! skipped tsan; then
  stage "TSan build"
  tools/build.sh build-tsan -DCOHORT_WERROR=ON -DCOHORT_TSAN=ON -DCOHORT_BENCH_PEERS=OFF -DCOHORT_CUDA=OFF
  stage "tests (TSan: the reactors' threads)"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    run_ctest build-tsan -L reactor
fi

if ! skipped fuzz && [ -f fuzz/CMakeLists.txt ]; then
  stage "fuzz targets (libFuzzer, short runs + corpus replay)"
  CC=clang CXX=clang++ tools/build.sh build-fuzz -DCOHORT_WERROR=ON -DCOHORT_FUZZ=ON -DCOHORT_BENCH_PEERS=OFF \
    -DCOHORT_CUDA=OFF -DCOHORT_TESTS=ON
  run_ctest build-fuzz -L fuzz
fi

if command -v julia >/dev/null 2>&1; then
  stage "Julia package (ffi/julia/Cohort.jl)"
  COHORT_LIBRARY="$PWD/build/lib/libcohort.so" julia --project=ffi/julia/Cohort.jl \
    ffi/julia/Cohort.jl/test/runtests.jl
else
  stage "Julia package: no julia on PATH, not run"
fi

printf '\n=== all tests passed in %d s ===\n' $(( $(date +%s) - t_all ))
