#!/usr/bin/env bash
# bench/udp_train.sh - the training demo over lossy links (issue 11): N ranks
# (4) in a namespace cluster behind --rate Mbit/s links (400) whose arriving
# packets nftables drops at random (--loss-proto all: TCP and UDP alike).
# For each loss rate: cohort-train --collective (allreduce avg over tcp)
# against cohort-train --loss-bound B over eth0:udp (B from --bounds, one per
# loss rate), the same seed, --iters local steps per rank each. Printed: the
# wall time, the final validation loss and accuracy (convergence per step:
# what losing gradient values costs), ms per sync, and what udp lost.
#
#   bench/udp_train.sh [--ranks 4] [--rate 400] [--losses "0 1 10"]
#                      [--bounds "0.01 0.01 0.1"] [--model-kb 4096] [--iters 200]
#                      [--build build]
set -euo pipefail
cd "$(dirname "$0")/.."
N=4 RATE=400 LOSSES="0 1 10" BOUNDS="0.01 0.01 0.1" MODEL_KB=4096 ITERS=200 BUILD=build
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) N=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --losses) LOSSES=$2; shift 2 ;;
    --bounds) BOUNDS=$2; shift 2 ;;
    --model-kb) MODEL_KB=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--ranks N] [--rate MBIT] [--losses 'L ...'] [--bounds 'B ...']" \
            "[--model-kb K] [--iters N] [--build DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "udp_train.sh: needs root (network namespaces)" >&2; exit 2; }
export COHORTRUN=$PWD/$BUILD/bin/cohortrun
export COHORT_UDP_RATE_MBPS=${COHORT_UDP_RATE_MBPS:-$RATE}
# At 10% drops a TCP link can back off past the default 10 s without progress.
export COHORT_TIMEOUT_MS=${COHORT_TIMEOUT_MS:-120000}
OUT=$(mktemp -d /tmp/cohort-udptrain.XXXXXX)
echo "udp_train.sh: $N ranks, $RATE Mbit/s links, model $MODEL_KB KiB; output in $OUT"
read -r -a B <<<"$BOUNDS"
i=0
for loss in $LOSSES; do
  bound=${B[$i]:-${B[-1]}}
  i=$((i + 1))
  cat > "$OUT/run-$loss.sh" <<EOS
#!/usr/bin/env bash
set -euo pipefail
c() { "$PWD/tests/cluster/cluster.sh" run "\$COHORT_CLUSTER" --timeout 900 "\$@"; }
t="$PWD/$BUILD/bin/cohort-train --mode allreduce --model-kb $MODEL_KB --max-iters $ITERS --max-time 600 --target-loss 0 --eval-every 20 --quiet --csv"
c -- \$t --collective > "$OUT/tcp-$loss.out" 2>&1
c --nics eth0:udp -- \$t --loss-bound $bound > "$OUT/udp-$loss.out" 2>&1
EOS
  chmod +x "$OUT/run-$loss.sh"
  tests/cluster/cluster.sh with ut+ "$N" --rates "$RATE" --loss "$loss" --loss-proto all -- \
    "$OUT/run-$loss.sh" > "$OUT/cluster-$loss.log" 2>&1 ||
    { echo "udp_train.sh: the run at $loss% failed:"; tail -n 20 "$OUT/cluster-$loss.log" \
        "$OUT"/*-"$loss".out; exit 1; }
done
printf "%-9s %5s %6s %8s %-26s %8s %s\n" transport loss bound wall_s "final model" sync_ms lost
i=0
for loss in $LOSSES; do
  bound=${B[$i]:-${B[-1]}}
  i=$((i + 1))
  for t in tcp udp; do
    f="$OUT/$t-$loss.out"
    wall=$(grep -h "csv:" "$f" | tail -1 | awk -F, '{print $NF}')
    fm=$(grep -h "final model" "$f" | sed 's/.*val loss \([0-9.]*\), accuracy \([0-9.]*\).*/loss \1, acc \2/' || true)
    ms=$(grep -h "avg sync time" "$f" | sed 's/.*avg sync time *\([0-9.]*\) ms.*/\1/' || true)
    lost=$(grep -h "bounded loss" "$f" | sed 's/.*: \([0-9.]*%\) of.*/\1/' || true)
    printf "%-9s %4s%% %6s %8s %-26s %8s %s\n" "$t" "$loss" "$([ $t = udp ] && echo "$bound" || echo -)" \
      "$wall" "$fm" "$ms" "${lost:--}"
  done
done
