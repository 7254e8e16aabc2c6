#!/usr/bin/env bash
# bench/relay.sh - relay groups against plain allreduce and selective sync,
# with one heavy-tailed straggler (issue 10's benchmark).
#
# N ranks (8) on loopback; every rank's compute time is drawn from the
# simulator's `transformer` distribution (x --compute-scale), and the last
# rank's is also multiplied by a Pareto(--tail) factor (a long tail: mean 3 for
# 1.5, capped at 8); a model of --model-mb MB is synchronised after every step.
# Each mode runs --duration seconds, one after the other in the same run, and
# the table prints per mode: iterations per second per rank, the time a rank
# spends in coh_sync per iteration (waiting for the others included), the
# group size, and the ratios to allreduce. Relay and allreduce compute the
# same full average every iteration; selective averages over groups.
# "relay-nojoin" is relay with COHORT_RELAY_SEGMENTS=1: phase 1 in one op, so
# the late rank's data always comes in phase 2 (no mid-phase join).
#
#   bench/relay.sh [--ranks 8] [--duration 60] [--model-mb 4] [--compute-scale 0.1]
#                  [--tail 1.5] [--seed 7] [--build build]
set -euo pipefail
cd "$(dirname "$0")/.."
N=8 DURATION=60 MODEL_MB=4 SCALE=0.1 TAIL=1.5 SEED=7 BUILD=build DIST=cnn
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) N=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --model-mb) MODEL_MB=$2; shift 2 ;;
    --compute-scale) SCALE=$2; shift 2 ;;
    --tail) TAIL=$2; shift 2 ;;
    --dist) DIST=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--ranks N] [--duration S] [--model-mb M] [--compute-scale X]" \
            "[--tail A] [--seed K] [--build DIR]" >&2; exit 2 ;;
  esac
done
for b in cohortrun cohort-syncbench; do
  [ -x "$BUILD/bin/$b" ] || { echo "relay.sh: $BUILD/bin/$b missing: run tools/build.sh" >&2; exit 2; }
done
OUT=$(mktemp -d /tmp/cohort-relay.XXXXXX)
echo "relay.sh: $N ranks, ${DURATION} s per mode, model ${MODEL_MB} MB, $DIST x $SCALE," \
     "rank $((N - 1)) x Pareto($TAIL); output in $OUT"
for mode in allreduce relay relay-nojoin selective; do
  segs=8
  [ "$mode" = relay-nojoin ] && segs=1
  COHORT_RELAY_SEGMENTS=$segs "$BUILD/bin/cohortrun" -n "$N" --timeout $((DURATION * 3 + 120)) -- \
    "$BUILD/bin/cohort-syncbench" --mode "${mode%-nojoin}" --duration "$DURATION" --model-mb "$MODEL_MB" --dist "$DIST" \
    --compute-scale "$SCALE" --straggler $((N - 1)) --tail "$TAIL" --seed "$SEED" --csv \
    > "$OUT/$mode.out" 2>&1 || { echo "relay.sh: $mode failed:"; tail -20 "$OUT/$mode.out"; exit 1; }
  grep -A1 '^\[0\] scheme,' "$OUT/$mode.out" | tail -1 | sed 's/^\[0\] //' > "$OUT/$mode.csv"
done
printf '\n| mode | iterations/s per rank | time in sync per iteration | sync time (group) | group size | iterations vs allreduce | time in sync vs allreduce |\n'
printf '|---|---|---|---|---|---|---|\n'
base=$(cat "$OUT/allreduce.csv")
for mode in allreduce relay relay-nojoin selective; do
  awk -F, -v b="$base" -v m="$mode" 'BEGIN { split(b, B, ",") }
    { printf "| %s | %.2f | %.1f ms | %.1f ms | %.2f | %.2fx | %.2fx |\n", m, $9, $8 * 1e3,
        $3 * 1e3, $4, $9 / B[9], ($8 > 0 ? B[8] / $8 : 0) }' "$OUT/$mode.csv"
done
