#!/usr/bin/env bash
# bench/peers/marginal_cpu.sh - CPU per allreduce, cohort against Open MPI, by difference.
#
# run.sh's CPU per GB is the ranks' CPU over a size's 20 timed iterations,
# and carries whatever else those processes did then. Here each
# implementation runs the same size twice, N1 and N2 iterations, under
# `perf stat -e task-clock` (every thread of every process the launcher
# starts, the kernel's work in their context included); the difference
# over N2 - N1 is the CPU one more op costs, with start-up, connection and
# warm-up costs gone. Both over loopback TCP (cohort with COHORT_SHM=0,
# Open MPI ob1 with btl self,tcp), alternating per size and round.
#
#   bench/peers/marginal_cpu.sh [-n RANKS] [--sizes "1M 4M"] [--rounds R]
#                               [--n1 N1] [--n2 N2] [--build DIR]
#
# Prints per round and size: each one's time per op (us, its own report of
# the N2 run) and marginal CPU per op (ms, all ranks), and cohort / mpi.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$ROOT/build
RANKS=2 SIZES="1M 4M" ROUNDS=2 N1=100 N2=400
while [ $# -gt 0 ]; do
    case "$1" in
    -n) RANKS=$2; shift ;;
    --sizes) SIZES=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --n1) N1=$2; shift ;;
    --n2) N2=$2; shift ;;
    --build) BUILD=$2; shift ;;
    -h | --help) sed -n 2,17p "$0"; exit 0 ;;
    *) echo "marginal_cpu.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
[ "$N2" -gt "$N1" ] || { echo "marginal_cpu.sh: --n2 must exceed --n1" >&2; exit 2; }
command -v perf >/dev/null || { echo "marginal_cpu.sh: perf not found (apt-get install linux-perf)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "marginal_cpu.sh: mpirun not found" >&2; exit 2; }
BIN=$BUILD/bin
[ -x "$BIN/cohort-bench" ] && [ -x "$BIN/mpi-bench" ] || { echo "marginal_cpu.sh: build $BUILD first" >&2; exit 2; }
COH=(env COHORT_SHM=0 "$BIN/cohortrun" -n "$RANKS" --no-prefix -- "$BIN/cohort-bench")
ASROOT=()
[ "$(id -u)" = 0 ] && ASROOT=(--allow-run-as-root)
MPI=(mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo
    --mca btl_tcp_disable_family 6 "${ASROOT[@]}" -np "$RANKS" "$BIN/mpi-bench")

# run CMD... N SIZE: prints "cpu_ms time_us" (time from the bench's CSV line)
run() {
    local n=${*: -2:1} s=${*: -1} out
    out=$(perf stat -x, -e task-clock -- "${@:1:$#-2}" --csv -b "$s" -e "$s" -n "$n" -w 20 -c 0 2>&1) || {
        echo "marginal_cpu.sh: failed: ${*:1:$#-2}" >&2
        echo "$out" | tail -5 >&2
        exit 1
    }
    local cpu t
    cpu=$(echo "$out" | awk -F, '/task-clock/ {print $1}')
    # CSV: redop,bytes,count,dtype,nranks,time_us,...
    t=$(echo "$out" | awk -F, '$1 != "cpu" && NF >= 8 && $2 + 0 > 0 {print $6; exit}')
    echo "$cpu $t"
}

printf '# %s, %s ranks, N1 %s, N2 %s; marginal CPU = (cpu(N2) - cpu(N1)) / (N2 - N1)\n' \
    "$(date -Is)" "$RANKS" "$N1" "$N2"
printf '%5s %6s %12s %12s %14s %14s %10s\n' round size cohort_us mpi_us cohort_cpu_ms mpi_cpu_ms cpu_ratio
for r in $(seq "$ROUNDS"); do
    for s in $SIZES; do
        read -r c1 _ < <(run "${COH[@]}" "$N1" "$s")
        read -r c2 ct < <(run "${COH[@]}" "$N2" "$s")
        read -r m1 _ < <(run "${MPI[@]}" "$N1" "$s")
        read -r m2 mt < <(run "${MPI[@]}" "$N2" "$s")
        awk -v r="$r" -v s="$s" -v c1="$c1" -v c2="$c2" -v m1="$m1" -v m2="$m2" -v ct="$ct" -v mt="$mt" \
            -v d=$((N2 - N1)) 'BEGIN {
                cc = (c2 - c1) / d; mc = (m2 - m1) / d
                printf "%5d %6s %12.1f %12.1f %14.3f %14.3f %10.2f\n", r, s, ct, mt, cc, mc, (mc > 0 ? cc / mc : 0)
            }'
    done
done
