#!/usr/bin/env bash
# bench/contention.sh - small-op latency when the host's cores are contended
# (issue 15 item 0, issue 12): 4 KiB and 64 KiB allreduce times with 0, 1 and
# 2 foreign busy processes (shell loops), and with compute threads inside every
# rank (--compute-threads of the benchmarks: a trainer's own threads computing
# beside its allreduces), on 2 and 4 ranks, in one run:
#   cohort tcp (COHORT_SHM=0) against Open MPI ob1/tcp on loopback,
#   cohort shm (COHORT_SHM=1) against Open MPI vader.
# Each cell is the median of --iters iterations (the slowest rank's time per
# iteration), in microseconds; the ratio columns are cohort / Open MPI (lower
# is better). A median favours waiters that never give the CPU away: an op
# that ran while both ranks were on a core counts as much as one that waited
# for a time slice; --pct also prints both sides' p90 and mean (the mean is
# what a training step pays), and the span: per iteration the last rank in to
# the last rank out, p50/mean (`--span` of the benchmarks: the slowest rank's
# call also counts how far apart the ranks entered it; the mean span is the
# period of back-to-back ops).
#
# With compute threads the row also prints what they computed meanwhile, in
# Gflop/s over all ranks (more is better: cycles a waiter took are not there).
#
#   bench/contention.sh [--iters 2000] [--ranks "2 4"] [--busy "0 1 2"] [--threads "1"]
#                       [--build build] [--pct]
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=2000 RANKS="2 4" BUSY="0 1 2" THREADS="1" BUILD=build PCT=0
while [ $# -gt 0 ]; do
    case $1 in
    --iters) ITERS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --busy) BUSY=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --pct) PCT=1; shift ;;
    *) echo "usage: $0 [--iters N] [--ranks LIST] [--busy LIST] [--threads LIST] [--build DIR] [--pct]" >&2; exit 2 ;;
    esac
done
B=$BUILD/bin
for b in cohortrun cohort-bench mpi-bench; do
    [ -x "$B/$b" ] || { echo "contention.sh: $B/$b missing: build first" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "contention.sh: mpirun not found" >&2; exit 2; }
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
MPI=(mpirun --oversubscribe --bind-to none --mca pml ob1 "${ROOT[@]}")
ARGS=(--csv -b 4K -e 64K -f 16 -n "$ITERS" -w 100 -c 1 -o sum -d float --span)
PIDS=()
stop_busy() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cohort-contention.XXXXXX")
trap 'stop_busy; rm -rf "$WORK"' EXIT

# run IMPL N THREADS: the benchmark's output in $WORK/IMPL
run() {
    local impl=$1 n=$2 a=("${ARGS[@]}" --pct)
    [ "$3" -gt 0 ] && a+=(--compute-threads "$3")
    case $impl in
    tcp) COHORT_SHM=0 "$B/cohortrun" -n "$n" --no-prefix -- "$B/cohort-bench" "${a[@]}" ;;
    shm) COHORT_SHM=1 "$B/cohortrun" -n "$n" --no-prefix -- "$B/cohort-bench" "${a[@]}" ;;
    mpitcp) "${MPI[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo -np "$n" "$B/mpi-bench" "${a[@]}" ;;
    vader) "${MPI[@]}" --mca btl self,vader -np "$n" "$B/mpi-bench" "${a[@]}" ;;
    esac >"$WORK/$impl" 2>"$WORK/$impl.err" || { echo "contention.sh: $impl on $n ranks failed:" >&2; tail -5 "$WORK/$impl.err" >&2; exit 1; }
}
# med IMPL: "t4k t64k"; tail IMPL: "p90/mean" at 4K and 64K
med() { awk -F, '$1 == "sum" { printf "%s ", $6 }' "$WORK/$1"; }
tail_() { awk -F, '$1 == "pct" { printf "%7s/%-7s ", $4, $8 }' "$WORK/$1"; }
# comp IMPL: the compute threads' Gflop/s at 4K and 64K
comp_() { awk -F, '$1 == "compute" { v = v (v == "" ? "" : "/") $3 } END { printf "%-15s ", v }' "$WORK/$1"; }
# span IMPL: the span's "p50/mean" at 4K and 64K
span_() { awk -F, '$1 == "span" { printf "%7s/%-7s ", $3, $5 }' "$WORK/$1"; }

printf "# bench/contention.sh, %s, %s cpus, %s iterations; us per allreduce (median)\n" \
    "$(date -Is)" "$(nproc)" "$ITERS"
printf "%5s %4s | %9s %9s %9s %9s | %9s %9s %9s %9s | %7s %7s %7s %7s\n" ranks busy \
    "tcp 4K" "mpi 4K" "tcp 64K" "mpi 64K" "shm 4K" "vader 4K" "shm 64K" "vader 64K" \
    "tcp/mpi" "" "shm/vd" ""
# Rows: K busy processes and no compute threads ("K"), then no busy process
# and T compute threads in every rank ("tT").
ROWS=""
for k in $BUSY; do ROWS="$ROWS $k:0"; done
for t in $THREADS; do [ "$t" -gt 0 ] && ROWS="$ROWS 0:$t"; done
for n in $RANKS; do
    for row in $ROWS; do
        k=${row%:*} t=${row#*:}
        stop_busy
        for _ in $(seq 1 "$k"); do
            (while :; do :; done) &
            PIDS+=($!)
        done
        for impl in tcp mpitcp shm vader; do run "$impl" "$n" "$t"; done
        read -r t4 t64 <<<"$(med tcp)"
        read -r m4 m64 <<<"$(med mpitcp)"
        read -r s4 s64 <<<"$(med shm)"
        read -r v4 v64 <<<"$(med vader)"
        stop_busy
        label=$k
        [ "$t" -gt 0 ] && label=t$t
        awk -v n="$n" -v k="$label" -v t4="$t4" -v m4="$m4" -v t64="$t64" -v m64="$m64" \
            -v s4="$s4" -v v4="$v4" -v s64="$s64" -v v64="$v64" 'BEGIN {
            printf "%5d %4s | %9.2f %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f %9.2f | %7.2f %7.2f %7.2f %7.2f\n",
                n, k, t4, m4, t64, m64, s4, v4, s64, v64, t4 / m4, t64 / m64, s4 / v4, s64 / v64 }'
        if [ "$PCT" = 1 ]; then
            echo "           p90/mean (4K 64K): tcp $(tail_ tcp) mpi $(tail_ mpitcp)"
            echo "                              shm $(tail_ shm) vader $(tail_ vader)"
            echo "      span p50/mean (4K 64K): tcp $(span_ tcp) mpi $(span_ mpitcp)"
            echo "                              shm $(span_ shm) vader $(span_ vader)"
        fi
        if [ "$t" -gt 0 ]; then
            echo "     compute Gflop/s (4K/64K): tcp $(comp_ tcp) mpi $(comp_ mpitcp) shm $(comp_ shm) vader $(comp_ vader)"
        fi
    done
done
echo "# busy: foreign busy processes; tT: none, and T compute threads in every rank"
echo "# ratio columns: cohort / Open MPI at 4K and 64K (tcp against ob1/tcp, shm against vader)"
