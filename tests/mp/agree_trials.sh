#!/usr/bin/env bash
# agree_trials.sh COHORTRUN TEST_RELAY TRIALS: test_relay agree again and
# again, 4 ranks; the victim (the straggler, a ready rank, the coordinator)
# and the moment of its death vary. Every trial must end with the three
# survivors OK: every sync succeeded, exact for its group, and the same on
# every survivor (a relay op is kept by all survivors or retried by all).
set -u
run=$1 prog=$2 trials=${3:-20}
fail=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
read -r -a victims <<< "${VICTIMS:-3 2 1 0}"
for ((i = 0; i < trials; i++)); do
  victim=${victims[i % ${#victims[@]}]}
  out=$(COHORT_LIVENESS_MS=1000 COHORT_TIMEOUT_MS=4000 "$run" -n 4 --keep-going --timeout 60 -- \
        "$prog" agree 120 "$dir" "$victim" 2>&1)
  code=$?
  oks=$(printf '%s\n' "$out" | grep -cE "rank [0-9]+: OK agree")
  if [ "$code" = 137 ] && [ "$oks" -ge 3 ]; then
    printf 'trial %2d victim %d: OK (%s)\n' "$i" "$victim" \
      "$(printf '%s\n' "$out" | grep -oE '\([0-9]+ without it\)' | head -1)"
  else
    fail=$((fail + 1))
    printf -- '--- trial %d (victim %d) failed, exit %s:\n%s\n' "$i" "$victim" "$code" "$out"
  fi
done
echo "$((trials - fail)) passed, $fail failed"
[ "$fail" = 0 ]
