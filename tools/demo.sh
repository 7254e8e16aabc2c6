#!/usr/bin/env bash
# The main job: install what is missing, build, and train a small model with
# data-parallel SGD on 4 local ranks, one of them a 3x straggler, once per
# synchronisation mode (allreduce, partial, selective); print time to the
# target loss, iterations, average sync time and scale per mode.
#   tools/demo.sh [train_modes.sh options]      e.g. --ranks 6
#   tools/demo.sh --allreduce-demo              the collective bandwidth demo instead
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh build
if [ "${1:-}" = "--allreduce-demo" ]; then
  shift
  exec build/bin/cohortrun -n "${COHORT_DEMO_RANKS:-4}" -- build/bin/cohort-demo "$@"
fi
exec examples/train_modes.sh "$@"
