#!/usr/bin/env bash
# contention.sh COHORTRUN COHORT_BENCH: small ops stay fast when the host has
# one runnable thread more than cores (issue 15 item 0). 2 ranks over
# loopback TCP beside nproc-1 foreign busy loops; the p90 of 4 KiB and 64 KiB
# allreduce must stay under LIMIT_US.
#
# What it caught: with a 2 ms spin the waiter slept after its spin, the
# kernel woke it beside its peer on one core (the busy loop had the other),
# and from then on each op waited for the other rank's spin to run out: p90
# 2-4 ms at 4 KiB and 4 ms at 64 KiB (3 runs of 3 on 2 cores), 20-140 us since
# the spin outlasts a time slice (rx_config_spin_us). Timing: run alone.
set -u
run=$1 bench=$2
LIMIT_US=${LIMIT_US:-1500}
ncpu=$(nproc)
busy=$((ncpu - 1))
[ "$busy" -ge 1 ] || busy=1
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
for ((i = 0; i < busy; i++)); do
    (while :; do :; done) &
    pids+=($!)
done

attempt() {
    local out
    out=$(COHORT_SHM=0 "$run" -n 2 --no-prefix --timeout 120 -- "$bench" --csv -b 4K -e 64K -f 16 \
        -n 2000 -w 100 --pct) || { echo "contention.sh: the benchmark failed"; return 2; }
    echo "$out" | awk -F, -v lim="$LIMIT_US" '
        $1 == "pct" { n++; printf "  %6d bytes: p50 %s p90 %s mean %s us\n", $2, $3, $4, $8
                      if ($4 + 0 > lim) bad++ }
        END { if (n != 2) { print "  expected 2 pct lines, got " n; exit 2 }
              exit bad ? 1 : 0 }'
}

echo "2 ranks over TCP, $busy busy loop(s) on $ncpu CPUs, p90 limit $LIMIT_US us"
# Sanitizer builds (COHORT_TIMING_CHECKS=0): a 64 KiB op alone takes 8x as
# long there, and the p90 went past 7 ms; run and report, do not judge.
if [ "${COHORT_TIMING_CHECKS:-1}" = 0 ]; then
    attempt
    rc=$?
    echo "timing not judged in this build (COHORT_TIMING_CHECKS=0)"
    [ $rc -eq 2 ] && exit 1
    exit 0
fi
# One retry: the host is shared; the defect showed in every run.
for try in 1 2; do
    attempt
    rc=$?
    [ $rc -eq 0 ] && { echo "contention.sh: ok"; exit 0; }
    [ $rc -eq 2 ] && exit 1
    echo "attempt $try: a p90 above $LIMIT_US us"
done
echo "contention.sh: FAIL" >&2
exit 1
