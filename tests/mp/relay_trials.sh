#!/usr/bin/env bash
# relay_trials.sh COHORTRUN TEST_RELAY kill|stop TRIALS: the relay fault test
# (test_relay fault) again and again, 4 ranks; the victim and the moment
# vary: mostly the straggler, every fifth trial the coordinator (the survivors
# elect another), some trials a rank that is ready. Every trial must end with the three
# survivors OK (no hang, no wrong value, the failure reported once). Prints
# the time from the fault to the survivors' next completed sync, p50 / p99.
set -u
run=$1 prog=$2 kind=$3 trials=${4:-50}
pass=0 fail=0 hang=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
: > "$dir/rec"
for ((i = 0; i < trials; i++)); do
  victim=$(( i % 5 == 4 ? 0 : i % 4 == 3 ? 1 + (i / 4) % 2 : 3 ))
  rm -f "$dir/t_fault" "$dir/pid"
  t0=$(date +%s.%N)
  out=$(COHORT_LIVENESS_MS=1000 COHORT_TIMEOUT_MS=4000 "$run" -n 4 --keep-going --timeout 40 -- \
        "$prog" fault "$kind" "$dir" "$victim" 2>&1)
  code=$?
  t1=$(date +%s.%N)
  oks=$(printf '%s\n' "$out" | grep -cE "rank [0-9]+: OK fault")
  rec=$(printf '%s\n' "$out" | sed -n 's/^\[[0-9]*\] .*recovery_ms \([0-9.-]*\).*/\1/p' | head -1)
  if [ "$code" = 137 ] && [ "$oks" -ge 3 ]; then
    pass=$((pass + 1))
    [ -n "$rec" ] && echo "$rec $victim" >> "$dir/rec"
  else
    fail=$((fail + 1))
    printf '%s\n' "$out" | grep -qE "timed out after|hangs" && hang=$((hang + 1))
    printf -- '--- trial %d (%s rank %d) failed, exit %s:\n%s\n' "$i" "$kind" "$victim" "$code" "$out"
  fi
  printf 'trial %2d %s rank %d: exit %s, %d OK, recovery %s ms, %.1f s\n' "$i" "$kind" "$victim" \
    "$code" "$oks" "${rec:-?}" "$(echo "$t1 - $t0" | bc)"
done
pct() { # label, awk filter on "recovery victim"
  awk "$2" "$dir/rec" | sort -n | awk '{v[NR] = $1} END {
    if (NR) printf "recovery after a %s (%s): p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d trials\n",
      kind, label, v[int((NR + 1) / 2)], v[int(0.99 * NR + 0.999)], v[NR], NR }' kind="$kind" label="$1"
}
pct "any rank" '{print $1}'
pct "the coordinator" '$2 == 0 {print $1}'
pct "another rank" '$2 != 0 {print $1}'
echo "hangs: $hang"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
