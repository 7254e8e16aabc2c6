#!/usr/bin/env bash
# The main job: install what is missing, build, and run a local 4-rank
# allreduce demo that prints what it did and the bandwidth it reached.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh build
exec build/bin/cohortrun -n "${COHORT_DEMO_RANKS:-4}" -- build/bin/cohort-demo "$@"
