#!/usr/bin/env bash
# stop_trials.sh COHORTRUN TEST_HARDENING TRIALS: the SIGSTOP sync test, again
# and again (modes and the stopped rank vary; the moment is random inside the
# program). Counts hangs (the launcher's timeout) and other failures; every
# trial must pass. Prints "N passed, M failed" and the time per trial.
set -u
run=$1 prog=$2 trials=${3:-30}
modes=(allreduce partial selective)
pass=0 fail=0 hang=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for ((i = 0; i < trials; i++)); do
  mode=${modes[$((i % 3))]}
  victim=$(( i % 5 == 4 ? 0 : 3 )) # every fifth trial stops the coordinator
  t0=$(date +%s.%N)
  out=$(COHORT_LIVENESS_MS=1000 COHORT_TIMEOUT_MS=4000 "$run" -n 4 --keep-going --timeout 40 -- \
        "$prog" sync-stop "$mode" "$dir/pid" "$victim" 2>&1)
  code=$?
  t1=$(date +%s.%N)
  oks=$(printf '%s\n' "$out" | grep -cE "rank [0-9]+: OK")
  if [ "$code" = 137 ] && [ "$oks" -ge 3 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    printf '%s\n' "$out" | grep -qE "timed out after|hangs" && hang=$((hang + 1))
    printf -- '--- trial %d (%s, rank %d stopped) failed, exit %s:\n%s\n' "$i" "$mode" "$victim" "$code" "$out"
  fi
  printf 'trial %2d %-9s stopped rank %d: exit %s, %d OK, %.1f s\n' "$i" "$mode" "$victim" "$code" "$oks" \
    "$(echo "$t1 - $t0" | bc)"
done
echo "hangs: $hang"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
