#!/usr/bin/env bash
# bench/udp_spray.sh - spraying one bounded-loss op over two udp rails
# (issue 11 item 5; docs/udp.md). Root: a namespace cluster of N ranks (4)
# with two NICs each, shaped --rates (two pairs by default: 400:400 and
# 400:100 Mbit/s), nftables dropping --loss percent of every packet. In one
# run per pair and loss, --iters 16 MiB allreduces:
#   tcp1    the ring on eth0 alone
#   tcp2    the ring striped over both rails (the rail balancer's split)
#   udp1    bounded loss (--bound) on eth0 alone
#   slice   bounded loss on both udp rails, each its own slice (COHORT_UDP_SPRAY=0)
#   spray   bounded loss, every op's datagrams sprayed over both rails
# udp rails get their link's rate as line rate (NIC:udp@MBPS). Printed: p50,
# p90, p99 (ms; each iteration the slowest rank's), lost fraction, and each
# mode's p50 over tcp1's and over the ideal (all bytes at both links' sum).
#
#   bench/udp_spray.sh [--ranks 4] [--pairs "400:400 400:100"] [--losses "0 1"]
#                      [--iters 20] [--bound 0.01] [--build build]
set -euo pipefail
cd "$(dirname "$0")/.."
N=4 PAIRS="400:400 400:100" LOSSES="0 1" ITERS=20 BOUND=0.01 BUILD=build SIZE=16M
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) N=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --losses) LOSSES=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --bound) BOUND=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--ranks N] [--pairs 'A:B ...'] [--losses 'L ...'] [--iters K]" \
            "[--bound B] [--build DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "udp_spray.sh: needs root (network namespaces)" >&2; exit 2; }
for b in cohortrun cohort-bench; do
  [ -x "$BUILD/bin/$b" ] || { echo "udp_spray.sh: $BUILD/bin/$b missing: run tools/build.sh" >&2; exit 2; }
done
export COHORTRUN=$PWD/$BUILD/bin/cohortrun
OUT=$(mktemp -d /tmp/cohort-spray.XXXXXX)
echo "udp_spray.sh: $N ranks x 2 NICs, $SIZE allreduces x $ITERS, bound $BOUND; output in $OUT"
cat > "$OUT/run.sh" <<EOS
#!/usr/bin/env bash
# run.sh TAG RATE0 RATE1
set -euo pipefail
c() { "$PWD/tests/cluster/cluster.sh" run "\$COHORT_CLUSTER" --timeout 900 "\$@"; }
b() { c --nics "\$1" -- "$PWD/$BUILD/bin/cohort-bench" -b $SIZE -e $SIZE -n $ITERS -w 2 -c 0 --pct \
        \${2:+--loss-bound \$2}; }
u="eth0:udp@\$2,eth1:udp@\$3"
b eth0 > "$OUT/tcp1-\$1.out" 2>&1
b eth0,eth1 > "$OUT/tcp2-\$1.out" 2>&1
b eth0:udp@\$2 $BOUND > "$OUT/udp1-\$1.out" 2>&1
COHORT_UDP_SPRAY=0 b "\$u" $BOUND > "$OUT/slice-\$1.out" 2>&1
COHORT_UDP_SPRAY=1 b "\$u" $BOUND > "$OUT/spray-\$1.out" 2>&1
EOS
chmod +x "$OUT/run.sh"
printf "%-8s %5s %-6s %9s %9s %9s %8s %8s %8s\n" rates loss mode p50_ms p90_ms p99_ms lost \
  p50/tcp1 p50/ideal
for pair in $PAIRS; do
  r0=${pair%%:*} r1=${pair##*:}
  for loss in $LOSSES; do
    tag=$r0-$r1-$loss
    tests/cluster/cluster.sh with us+ "$N" --nics 2 --rates "$pair" --loss "$loss" --loss-proto all \
      -- "$OUT/run.sh" "$tag" "$r0" "$r1" > "$OUT/cluster-$tag.log" 2>&1 ||
      { echo "udp_spray.sh: the run $tag failed:"; tail -n 5 "$OUT/cluster-$tag.log" "$OUT"/*-"$tag".out
        exit 1; }
    t1=""
    for m in tcp1 tcp2 udp1 slice spray; do
      line=$(grep -h '^\[0\] pct,' "$OUT/$m-$tag.out" | tail -1 | sed 's/^\[0\] //')
      IFS=, read -r _ bytes p50 p90 p99 _ lost _ <<<"$line"
      [ -n "$t1" ] || t1=$p50
      # Ideal: each rank moves 2 (N-1)/N of the bytes at the two links' sum.
      awk -v m="$m" -v pr="$pair" -v l="$loss" -v a="$p50" -v b="$p90" -v c="$p99" -v lo="$lost" \
          -v t="$t1" -v by="$bytes" -v n="$N" -v r="$((r0 + r1))" 'BEGIN {
        ideal = 2 * (n - 1) / n * by * 8 / (r * 1e6) * 1e6
        printf "%-8s %4s%% %-6s %9.1f %9.1f %9.1f %7.3f%% %8.2f %8.2f\n",
               pr, l, m, a / 1e3, b / 1e3, c / 1e3, 100 * lo, a / t, a / ideal }'
    done
  done
done
