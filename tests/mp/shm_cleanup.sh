#!/usr/bin/env bash
# shm_cleanup.sh COHORTRUN TEST_FAULTS - nothing of a job's shared memory
# outlives it, even when a rank is killed in the middle of an op: the rings
# are memfds (no name anywhere), and the sockets' directory that cohortrun
# made for the job (COHORT_SHM_DIR) is gone once cohortrun returns.
set -u
run=$1 faults=$2
out=$("$run" -n 3 --keep-going --timeout 60 -- sh -c \
  'echo "shm dir: $COHORT_SHM_DIR"; exec "$0" kill' "$faults" 2>&1)
code=$?
printf '%s\n' "$out"
[ "$code" = 137 ] || { echo "shm_cleanup.sh: exit $code, expected 137 (a rank killed)" >&2; exit 1; }
[ "$(printf '%s\n' "$out" | grep -c 'rank [0-9]: OK')" -ge 2 ] ||
  { echo "shm_cleanup.sh: the survivors did not finish" >&2; exit 1; }
dir=$(printf '%s\n' "$out" | sed -n 's/.*shm dir: //p' | head -n 1)
case $dir in
*/cohortrun-*) ;;
*) echo "shm_cleanup.sh: cohortrun gave no directory of its own ('$dir')" >&2; exit 1 ;;
esac
if [ -e "$dir" ]; then
  echo "shm_cleanup.sh: $dir is still there after the job:" >&2
  find "$dir" >&2
  exit 1
fi
echo "shm_cleanup.sh: OK: $dir is gone"
