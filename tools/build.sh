#!/usr/bin/env bash
# tools/build.sh [DIR] [cmake args...]: configure and build (default DIR=build).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
[ $# -gt 0 ] && shift
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$jobs"
