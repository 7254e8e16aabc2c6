#!/bin/sh
# bench_cpu.sh COHORTRUN COHORT_BENCH: cohort-bench's CPU per GB counts the
# timed iterations only, not the check of the result that follows them (-c 1).
# The check of 16 MiB costs more than two of its allreduces: read after it, the
# figure was 2.7-3x the one without the check. The least of three runs each
# (CPU time on a shared VM moves by a third from run to run).
set -eu
run=$1 bench=$2
cpu() { # the CPU per GB line's figure
  COHORT_SHM=0 "$run" -n 2 --timeout 60 --no-prefix -- "$bench" --csv -b 16M -e 16M -n 2 -w 1 -c "$1" |
    awk -F, '$1 == "cpu" { print $3 }'
}
least() { sort -g | head -n 1; }
c0=$( (cpu 0; cpu 0; cpu 0) | least)
c1=$( (cpu 1; cpu 1; cpu 1) | least)
echo "CPU s per GB, least of three: without the check $c0, with it $c1"
[ -n "$c0" ] && [ -n "$c1" ] || { echo "no cpu line"; exit 1; }
awk -v a="$c0" -v b="$c1" 'BEGIN { exit !(b < 1.6 * a) }' ||
  { echo "the check's CPU is counted: $c1 against $c0"; exit 1; }
