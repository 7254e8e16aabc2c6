#!/bin/sh
# bench_cpu.sh COHORTRUN COHORT_BENCH: cohort-bench's CPU per GB counts the
# timed iterations only, not the check of the result that follows them (-c 1).
# The check of 16 MiB costs more than two of its allreduces: read after it, the
# figure was 2.7-3x the one without the check (1.8-2 with a warm link). The
# least of seven runs each (CPU time on a shared VM moves by a third from run
# to run; with three, one CI run read 1.64 against 1.07, 2026-11-30), taken in
# turn so that a busy moment hits both kinds alike, against 1.55x: with seven
# the right build read 0.78-1.28x, one whose figure counts the check
# 1.85-2.07x (4 runs each). Four warm-up calls: a fresh loopback connection's
# first 16 MiB calls take 3-5x a warm one's (Open MPI's too), and with one
# warm-up a run fell into them by chance (CI read 2.27 against 1.32). Alone (RUN_SERIAL): beside another test's
# ranks a waiting rank spins while its peer is off the CPU.
set -eu
run=$1 bench=$2
cpu() { # the CPU per GB line's figure
  COHORT_SHM=0 "$run" -n 2 --timeout 60 --no-prefix -- "$bench" --csv -b 16M -e 16M -n 2 -w 4 -c "$1" |
    awk -F, '$1 == "cpu" { print $3 }'
}
least() { sort -g | head -n 1; }
a= b=
for i in 1 2 3 4 5 6 7; do
  a="$a $(cpu 0)"
  b="$b $(cpu 1)"
done
c0=$(printf '%s\n' $a | least)
c1=$(printf '%s\n' $b | least)
echo "CPU s per GB, least of seven: without the check $c0, with it $c1"
[ -n "$c0" ] && [ -n "$c1" ] || { echo "no cpu line"; exit 1; }
awk -v a="$c0" -v b="$c1" 'BEGIN { exit !(b < 1.55 * a) }' ||
  { echo "the check's CPU is counted: $c1 against $c0"; exit 1; }
