#!/usr/bin/env bash
# examples/train_modes.sh [--ranks N] [--cluster NAME] [--modes LIST] [trainer args...]
#
# The main job: train the same model once per synchronisation mode
# (allreduce, partial, selective) with one persistent straggler, and compare
# time to the target loss, iterations, sync time and group size.
#
#   --ranks N      ranks on loopback under build/bin/cohortrun (default 4)
#   --cluster NAME run inside the cluster harness instead:
#                  tests/cluster/cluster.sh run NAME -- cohort-train ...
#   --modes LIST   comma list of allreduce, partial, selective and collective
#                  (allreduce mode through plain coh_allreduce, no coordinator);
#                  default allreduce,partial,selective
#   anything else goes to cohort-train (see build/bin/cohort-train --help) and
#   overrides the defaults below. COHORT_BUILD_DIR picks the build (build).
#
# Default run: ~15-30 s per mode on 4 ranks. Rank N-1 computes 3x slower
# (--slow), compute times follow docs/sched.md's cnn distribution scaled to
# ~20 ms a step, and the synchronised buffer is padded to 4 MiB. Scheduler
# parameters come from COHORT_SCHED (docs/sched.md), e.g. COHORT_SCHED=p=3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
ranks=4
cluster=
modes=allreduce,partial,selective
args=()
while [ $# -gt 0 ]; do
  case $1 in
  --ranks) ranks=$2; shift 2 ;;
  --cluster) cluster=$2; shift 2 ;;
  --modes) modes=$2; shift 2 ;;
  -h | --help) sed -n '2,21s/^# \{0,1\}//p' "$0"; exit 0 ;;
  *) args+=("$1"); shift ;;
  esac
done

trainer=$build/bin/cohort-train
launcher=$build/bin/cohortrun
for b in "$trainer" "$launcher"; do
  if [ ! -x "$b" ]; then
    echo "train_modes.sh: $b is missing; build first: bash tools/build.sh" >&2
    exit 1
  fi
done

# Defaults first: the trainer takes the last value of a repeated flag.
defaults=(--dist cnn --compute-scale 0.05 --model-kb 4096 --target-loss 0.5 --max-time 30)
if [ -z "$cluster" ]; then
  defaults+=(--slow "$((ranks - 1)):3")
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A status
IFS=, read -ra mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
  echo "== mode $mode =="
  case $mode in
  collective) mode_args=(--mode allreduce --collective) ;;
  *) mode_args=(--mode "$mode") ;;
  esac
  cmd=("$trainer" "${mode_args[@]}" "${defaults[@]}" "${args[@]}" --csv)
  if [ -n "$cluster" ]; then
    run=("$root/tests/cluster/cluster.sh" run "$cluster" --timeout 300 -- "${cmd[@]}")
  else
    run=("$launcher" -n "$ranks" --timeout 300 -- "${cmd[@]}")
  fi
  rc=0
  "${run[@]}" 2>&1 | tee "$out/$mode.log" | grep --line-buffered -v 'csv' || rc=${PIPESTATUS[0]}
  status[$mode]="failed (exit $rc)"
  echo
done

# The comparison: one row per mode from the trainers' csv lines; speed-up is
# allreduce's time to target over the mode's.
echo "== comparison: $([ -n "$cluster" ] && echo "cluster $cluster" || echo "$ranks ranks on loopback") =="
fmt='%-10s %5s %15s %8s %9s %18s %7s %9s %6s %10s %6s\n'
printf "$fmt" mode ranks time-to-target speed-up best-loss "iters tot/min/max" groups "sync ms" scale final-loss acc
base=
for mode in "${mode_list[@]}"; do
  line=$(sed -n 's/^\(\[[0-9]*\] \)\{0,1\}csv:\(.*\)$/\2/p' "$out/$mode.log" | tail -n 1)
  if [ -z "$line" ]; then
    printf '%-10s %s\n' "$mode" "${status[$mode]}"
    continue
  fi
  IFS=, read -r _ n reached ttt best it itmin itmax groups _ sync scale floss facc wall <<<"$line"
  speedup=-
  if [ "$reached" = 1 ]; then
    [ "$mode" = allreduce ] && base=$ttt
    [ -n "$base" ] && speedup=$(awk -v a="$base" -v b="$ttt" 'BEGIN { printf "%.2fx", a / b }')
    ttt=$(printf '%.2f s' "$ttt")
  else
    ttt="no (${wall} s)"
  fi
  printf "$fmt" "$mode" "$n" "$ttt" "$speedup" "$best" "$it/$itmin/$itmax" "$groups" \
    "$(printf '%.2f' "$sync")" "$(printf '%.2f' "$scale")" "$floss" "$facc"
done
