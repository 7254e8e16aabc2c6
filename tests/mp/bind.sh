#!/usr/bin/env bash
# bind.sh COHORTRUN COHORT_BENCH: cohortrun --bind core holds rank r (every
# thread of it) to the (r mod count)-th CPU of the launcher's own set, and
# without --bind leaves each rank the launcher's whole set.
set -u
run=$1 bench=$2
fail() { echo "bind.sh: $*" >&2; exit 1; }

# The CPUs of a list such as "0-2,5", one per line.
expand() {
    local part
    for part in ${1//,/ }; do
        if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
    done
}
# "RANK LIST" per rank, from each rank's /proc/self/status; the launcher
# runs on the CPUs of $1.
lists() {
    local own=$1
    shift
    taskset -c "$own" "$run" "$@" -- /bin/sh -c \
        'echo "$COHORT_RANK $(sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status)"' |
        sed 's/^\[[0-9]*\] //' | sort -n
}
check() { # check "LAUNCHER CPU LIST" N
    local own=$1 n=$2 cpus got want r
    mapfile -t cpus < <(expand "$own")
    got=$(lists "$own" -n "$n" --bind core)
    want=$(for ((r = 0; r < n; r++)); do echo "$r ${cpus[r % ${#cpus[@]}]}"; done)
    [ "$got" = "$want" ] || fail "launcher on $own, $n ranks: got
$got
expected
$want"
    echo "launcher on $own, $n ranks, --bind core: ok"
}

all=$(sed -n 's/^Cpus_allowed_list:\t//p' /proc/self/status)
mapfile -t cpus < <(expand "$all")
check "$all" $((${#cpus[@]} * 2 + 1))
check "${cpus[0]}" 3
[ ${#cpus[@]} -ge 2 ] && check "${cpus[1]}" 2

# Unbound (the default, and --bind none): every rank keeps the whole set.
for opt in "" "--bind none"; do
    got=$(lists "$all" -n 3 $opt | cut -d' ' -f2 | sort -u)
    [ "$got" = "$all" ] || fail "'$opt': ranks on '$got', expected '$all' each"
done
echo "unbound: every rank on $all"

"$run" -n 2 --bind socket -- true 2>/dev/null
[ $? -eq 2 ] || fail "--bind socket was not refused with exit code 2"

# A real job bound, more ranks than CPUs: results checked by the benchmark.
"$run" -n $((${#cpus[@]} + 1)) --bind core --timeout 120 -- "$bench" -b 4K -e 1M -f 16 -n 5 -w 2 ||
    fail "cohort-bench under --bind core failed"
echo "bind.sh: ok"
