#!/usr/bin/env bash
# bench/udp.sh - bounded-loss udp against tcp under random loss (issue 11's
# benchmark). Root: a namespace cluster (tests/cluster/cluster.sh) of N ranks
# (4) behind --rate Mbit/s links (400), where nftables drops --loss percent of
# what arrives at each rank (TCP and UDP alike: --loss-proto all), per packet
# (independent drops) or per GSO packet (bursts: a draw drops a whole packet
# of up to 44 TCP segments or 64 datagrams as the sender's stack made it):
# --units. For each loss rate and unit, in one run: --iters 16 MiB allreduces
# over tcp (the ring), then over eth0:udp with loss bound --bound (0.01); each
# iteration's time is the slowest rank's. Printed per transport, loss and
# unit: p50, p90, p99, max (ms), the fraction of datagram bytes lost, and
# udp's ratios to tcp's p50 at 0% loss (the line rate's bound) and to tcp's
# p50 / p99 at that loss.
#
#   bench/udp.sh [--ranks 4] [--rate 400] [--losses "0 1 5"] [--units "packet gso"]
#                [--size 16M] [--iters 30] [--tcp-iters K] [--bound 0.01]
#                [--pull-bound 0] [--build build]
# (--tcp-iters: tcp's iterations at a loss above 0, default --iters)
# (--pull-bound 0: the library's default, a quarter of --bound)
# udp's rate control: COHORT_UDP_RATE_MBPS defaults to --rate (the line);
# COHORT_UDP_* from the environment win.
set -euo pipefail
cd "$(dirname "$0")/.."
N=4 RATE=400 LOSSES="0 1 5" UNITS="packet gso" SIZE=16M ITERS=30 TITERS="" BOUND=0.01 PULL=0 BUILD=build
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) N=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --losses) LOSSES=$2; shift 2 ;;
    --units) UNITS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --tcp-iters) TITERS=$2; shift 2 ;;
    --bound) BOUND=$2; shift 2 ;;
    --pull-bound) PULL=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--ranks N] [--rate MBIT] [--losses 'L ...'] [--units 'packet gso'] [--size S] [--iters K] [--tcp-iters K]" \
            "[--bound B] [--build DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "udp.sh: needs root (network namespaces)" >&2; exit 2; }
for b in cohortrun cohort-bench; do
  [ -x "$BUILD/bin/$b" ] || { echo "udp.sh: $BUILD/bin/$b missing: run tools/build.sh" >&2; exit 2; }
done
export COHORTRUN=$PWD/$BUILD/bin/cohortrun
export COHORT_UDP_RATE_MBPS=${COHORT_UDP_RATE_MBPS:-$RATE}
OUT=$(mktemp -d /tmp/cohort-udp.XXXXXX)
echo "udp.sh: $N ranks, $RATE Mbit/s links, $SIZE allreduces x $ITERS, bound $BOUND (pull $PULL)," \
     "udp line rate $COHORT_UDP_RATE_MBPS Mbit/s; output in $OUT"
cat > "$OUT/run.sh" <<EOS
#!/usr/bin/env bash
set -euo pipefail
c() { "$PWD/tests/cluster/cluster.sh" run "\$COHORT_CLUSTER" --timeout 900 "\$@"; }
ti=$ITERS; [ "\$1" = 0 ] || ti=${TITERS:-$ITERS}
c -- "$PWD/$BUILD/bin/cohort-bench" -b $SIZE -e $SIZE -n \$ti -w 2 -c 0 --pct \
  > "$OUT/tcp-\$2-\$1.out" 2>&1
c --nics eth0:udp -- "$PWD/$BUILD/bin/cohort-bench" -b $SIZE -e $SIZE -n $ITERS -w 2 -c 0 --pct \
  --loss-bound $BOUND --pull-bound $PULL > "$OUT/udp-\$2-\$1.out" 2>&1
EOS
chmod +x "$OUT/run.sh"
# The runs: (loss, unit); at 0% the unit means nothing (one run).
RUNS=()
for loss in $LOSSES; do
  if awk -v l="$loss" 'BEGIN{exit !(l == 0)}'; then RUNS+=("$loss -"); continue; fi
  for unit in $UNITS; do RUNS+=("$loss $unit"); done
done
for r in "${RUNS[@]}"; do
  read -r loss unit <<<"$r"
  tests/cluster/cluster.sh with ub+ "$N" --rates "$RATE" --loss "$loss" --loss-proto all \
    --loss-unit "${unit/-/packet}" -- "$OUT/run.sh" "$loss" "$unit" \
    > "$OUT/cluster-$unit-$loss.log" 2>&1 ||
    { echo "udp.sh: the run at $loss% ($unit) failed:"; tail -n 20 "$OUT/cluster-$unit-$loss.log" \
        "$OUT"/*-"$unit-$loss".out; exit 1; }
done
printf "%-6s %6s %-6s %9s %9s %9s %9s %8s %9s %9s %9s\n" transport loss unit p50_ms p90_ms \
  p99_ms max_ms lost p50/tcp0 p50/tcp p99/tcp
tcp0=""
for r in "${RUNS[@]}"; do
  read -r loss unit <<<"$r"
  for t in tcp udp; do
    line=$(grep -h '^\[0\] pct,' "$OUT/$t-$unit-$loss.out" | tail -1 | sed 's/^\[0\] //')
    IFS=, read -r _ _ p50 p90 p99 mx lost _ <<<"$line"
    [ -n "$tcp0" ] || tcp0=$p50
    if [ "$t" = tcp ]; then tp50=$p50 tp99=$p99; fi
    awk -v t="$t" -v l="$loss" -v u="$unit" -v a="$p50" -v b="$p90" -v c="$p99" -v d="$mx" \
        -v lo="$lost" -v z="$tcp0" -v tp="$tp50" -v tq="$tp99" 'BEGIN {
      printf "%-6s %5s%% %-6s %9.1f %9.1f %9.1f %9.1f %7.3f%% %9.2f %9.2f %9.2f\n",
             t, l, u, a / 1e3, b / 1e3, c / 1e3, d / 1e3, 100 * lo, a / z, a / tp, c / tq }'
  done
done
