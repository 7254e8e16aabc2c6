#!/usr/bin/env bash
# bench/live_sync.sh - partial synchronisation measured live, beside what the
# simulator predicts for the same run (issue 4's live benchmark).
#
# N ranks (8) in a namespace cluster (tests/cluster), each rank's link shaped to
# its own rate drawn like the paper's round(20u, 3) Gbps, scaled so the fastest
# possible rank gets --rate-max Mbit/s; compute times from the `transformer`
# distribution; DURATION seconds per mode; modes allreduce, partial, selective.
# For each mode it runs cohort-syncbench, which also writes the run as a
# cohort-sim replay scenario (each rank's actual compute times and bandwidth),
# then replays that scenario in the simulator with the same parameters, and
# prints the paper's metrics side by side. Root only (namespaces).
#
#   bench/live_sync.sh [--ranks 8] [--duration 60] [--model-mb 4] [--rate-max 400]
#                      [--seed 7] [--compute-scale 1] [--alpha-ms 0.5] [--out DIR]
#                      [--modes "allreduce partial selective"] [--seed-bw]
#
# --seed-bw hands the coordinator every rank's true link rate at init
# (COHORT_SCHED_TRACE, bandwidths only): an oracle, to measure how much of the
# live/simulator gap the link estimates account for.
set -euo pipefail
cd "$(dirname "$0")/.."
N=8 DURATION=60 MODEL_MB=4 RATE_MAX=400 SEED=7 SCALE=1 ALPHA=0.5 OUT=""
MODES="allreduce partial selective" SEED_BW=0
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) N=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --model-mb) MODEL_MB=$2; shift 2 ;;
    --rate-max) RATE_MAX=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --compute-scale) SCALE=$2; shift 2 ;;
    --alpha-ms) ALPHA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --seed-bw) SEED_BW=1; shift ;;
    *) echo "usage: $0 [--ranks N] [--duration S] [--model-mb M] [--rate-max MBIT] [--seed S]" \
            "[--compute-scale X] [--alpha-ms A] [--out DIR] [--modes LIST] [--seed-bw]" >&2
       exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "live_sync.sh: needs root (network namespaces)" >&2; exit 77; }
for b in cohortrun cohort-syncbench cohort-sim; do
  [ -x build/bin/$b ] || { echo "live_sync.sh: build/bin/$b missing: run tools/build.sh" >&2; exit 2; }
done
OUT=${OUT:-$(mktemp -d /tmp/cohort-live.XXXXXX)}
mkdir -p "$OUT"
# The minimum group size the live coordinator uses: max(2, round(0.3 n)).
P=$(awk -v n="$N" 'BEGIN { p = int(0.3 * n + 0.5); if (p < 2) p = 2; print p }')
CLUSTER=live$$
cleanup() { tests/cluster/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM
tests/cluster/cluster.sh up "$CLUSTER" "$N" --rates-seed "$SEED" --rate-max "$RATE_MAX" >/dev/null
# Configured rate in Gbps, times what tbf delivers to TCP payload (1448/1514).
BW=$(tests/cluster/cluster.sh rates "$CLUSTER" | awk '{ printf "%s%.6f", sep, $4 * 0.9564 / 1000; sep = "," }')
echo "live_sync: $N ranks, rates (Gbps of payload) $BW"
echo "live_sync: transformer x $SCALE compute, model $MODEL_MB MB, $DURATION s per mode, p = $P"
if [ "$SEED_BW" = 1 ]; then
  # worker,bandwidth_gbps,compute_s with no compute sample (-1): rates only.
  tr , '\n' <<< "$BW" | awk '{ printf "%d,%s,-1\n", NR - 1, $1 }' > "$OUT/seed-bw.csv"
  export COHORT_SCHED_TRACE=$OUT/seed-bw.csv
  echo "live_sync: the coordinator starts with the true rates ($COHORT_SCHED_TRACE)"
fi

declare -A live sim simc
for mode in $MODES; do
  echo "live_sync: running $mode ..."
  tests/cluster/cluster.sh run "$CLUSTER" --timeout $((DURATION * 3 + 120)) -- \
    build/bin/cohort-syncbench --mode "$mode" --duration "$DURATION" --model-mb "$MODEL_MB" \
    --dist transformer --compute-scale "$SCALE" --seed "$SEED" --bw-list "$BW" \
    --replay-out "$OUT/replay-$mode.csv" --groups-out "$OUT/groups-$mode.csv" \
    --csv > "$OUT/live-$mode.txt" 2>&1 || {
      echo "live_sync: $mode failed:"; tail -20 "$OUT/live-$mode.txt"; exit 1; }
  row=$(grep -E "^\[0\] $mode," "$OUT/live-$mode.txt" | sed 's/^\[0\] //')
  live[$mode]=$row
  build/bin/cohort-sim replay "$OUT/replay-$mode.csv" --scheme "$mode" --model-mb "$MODEL_MB" \
    --alpha-ms "$ALPHA" --p "$P" --duration-s "$DURATION" > "$OUT/sim-$mode.txt"
  sim[$mode]=$(awk -F, '/^avg_sync_time_s/{t=$2} /^avg_sync_scale/{s=$2} /^total_sync/{n=$2}
                        /^total_iteration/{i=$2} END {print t","s","n","i}' "$OUT/sim-$mode.txt")
  # The simulator as the live coordinator runs: cold (no compute-time
  # CDFs in advance) and the scheduler's alpha of 1 ms.
  build/bin/cohort-sim replay "$OUT/replay-$mode.csv" --scheme "$mode" --model-mb "$MODEL_MB" \
    --alpha-ms 1 --start cold --p "$P" --duration-s "$DURATION" > "$OUT/sim-cold-$mode.txt"
  simc[$mode]=$(awk -F, '/^avg_sync_time_s/{print $2}' "$OUT/sim-cold-$mode.txt")
done

printf '\n%-10s | %-28s | %-28s | %s\n' mode "live: time scale syncs iters" \
  "sim:  time scale syncs iters" "sync time live/sim (live/sim cold, alpha 1 ms: time)"
for mode in $MODES; do
  IFS=, read -r _ _ lt ls ln li lw <<< "${live[$mode]}"
  IFS=, read -r st ss sn si <<< "${sim[$mode]}"
  ct=${simc[$mode]:-0}
  printf '%-10s | %6.3fs %5.2f %6d %6d | %6.3fs %5.2f %6d %6d | %.2f (%.2f: %.3fs)\n' "$mode" "$lt" \
    "$ls" "$ln" "$li" "$st" "$ss" "$sn" "$si" \
    "$(awk -v a="$lt" -v b="$st" 'BEGIN{print (b > 0 ? a / b : 0)}')" \
    "$(awk -v a="$lt" -v b="$ct" 'BEGIN{print (b > 0 ? a / b : 0)}')" "$ct"
done
# Group by group: the live duration against what Eq. 2 charges the same
# members at their true rates, 2(m-1) alpha + 2(m-1)/m v / b_min.
printf '\n%-10s | %7s %9s %9s %9s %7s\n' mode groups "live s" "Eq.2 s" "live-Eq.2" ratio
for mode in $MODES; do
  awk -F, -v bw="$BW" -v mb="$MODEL_MB" -v a="$ALPHA" -v mode="$mode" '
    BEGIN { nb = split(bw, b, ","); v = mb * 8 / 1000 }
    NR > 1 { m = split($3, r, " "); if (m < 2) next; bmin = 1e9
             for (i = 1; i <= m; i++) if (b[r[i] + 1] < bmin) bmin = b[r[i] + 1]
             e = 2 * (m - 1) * a / 1000 + 2 * (m - 1) / m * v / bmin
             n++; L += $4; E += e }
    END { if (n) printf "%-10s | %7d %9.3f %9.3f %9.3f %7.2f\n", mode, n, L / n, E / n,
                 (L - E) / n, L / E }' "$OUT/groups-$mode.csv"
done
[[ " $MODES " == *" partial "* && " $MODES " == *" selective "* ]] || {
  echo "live_sync: logs, scenarios and simulator output in $OUT"; exit 0; }
IFS=, read -r _ _ pt ps _ pi _ <<< "${live[partial]}"
IFS=, read -r _ _ qt qs _ qi _ <<< "${live[selective]}"
IFS=, read -r spt sps _ spi <<< "${sim[partial]}"
IFS=, read -r sqt sqs _ sqi <<< "${sim[selective]}"
awk -v pt="$pt" -v qt="$qt" -v ps="$ps" -v qs="$qs" -v pi="$pi" -v qi="$qi" \
    -v spt="$spt" -v sqt="$sqt" -v sps="$sps" -v sqs="$sqs" -v spi="$spi" -v sqi="$sqi" 'BEGIN {
  printf "\nselective vs partial     live    sim     paper\n"
  printf "sync time (lower x)      %5.2f   %5.2f   1.89-2.55\n", pt / qt, spt / sqt
  printf "sync scale (larger x)    %5.2f   %5.2f   1.19-1.25\n", qs / ps, sqs / sps
  printf "total iteration (x)      %5.2f   %5.2f   1.10-1.17\n", qi / pi, sqi / spi
}'
echo "live_sync: logs, scenarios and simulator output in $OUT"
