#!/usr/bin/env bash
# examples/torch_partial.sh [--ranks N] [--modes LIST] [torch_partial.py args...]
#
# The PyTorch version of the main job: the same MLP trained with DDP on the
# "cohort" backend, then with cohort.torch.PartialSync in partial and in
# selective mode, one straggler (rank N-1, 50 ms a step); prints each mode's
# time until rank 0's model reaches the target validation loss. Needs torch
# and the backend (build with python3-torch and libtorch-dev installed).
#   --ranks N    ranks under build/bin/cohortrun (default 4)
#   --modes LIST comma list of ddp, partial, selective (default: all three)
# Anything else goes to examples/torch_partial.py (--target, --budget,
# --straggler-ms, --eval-every). COHORT_BUILD_DIR picks the build (build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
ranks=4
modes=ddp,partial,selective
args=()
while [ $# -gt 0 ]; do
  case $1 in
  --ranks) ranks=$2; shift 2 ;;
  --modes) modes=$2; shift 2 ;;
  *) args+=("$1"); shift ;;
  esac
done
export COHORT_LIBRARY=$build/lib/libcohort.so PYTHONPATH=$root/ffi/python${PYTHONPATH:+:$PYTHONPATH}
results=()
for m in ${modes//,/ }; do
  echo "== $m"
  out=$("$build/bin/cohortrun" -n "$ranks" --timeout 300 -- /usr/bin/python3 \
    "$root/examples/torch_partial.py" --mode "$m" --target 0.7 --budget 60 "${args[@]}" 2>&1 |
    grep '^\[0\] ' | grep -v -i warn | sed 's/^\[0\] //')
  echo "$out" | grep -v '^RESULT'
  results+=("$(echo "$out" | grep '^RESULT')")
done
echo
echo "== time to target (rank 0's model), $ranks ranks, one straggler"
printf '%s\n' "${results[@]}"
