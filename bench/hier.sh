#!/usr/bin/env bash
# bench/hier.sh - hierarchical against flat collectives in a namespace
# cluster of two pretend hosts (issue 12). Root. 4 ranks (2 hosts x 2) behind
# --rate Mbit/s links (400); in one run, for each of --colls (allreduce
# broadcast allgather reduce_scatter) at --sizes (1M:64M:4):
#   tcp    every rank a host of its own: the flat ring over the links (the
#          baseline: no shared memory anywhere);
#   flat   two hosts of 2 (COHORT_CLUSTER_HOSTS): the flat ring, whose links
#          inside a host go through shared memory (COHORT_HIER=0);
#   hier   the same hosts, hierarchical (COHORT_HIER=1; docs/shm.md).
# Prints busbw (GB/s) per collective, size and mode, and hier's time against
# flat's and tcp's. Needs a build (tools/build.sh).
#
#   bench/hier.sh [--rate 400] [--sizes 1M:64M:4] [--iters 10] [--colls "..."]
#                 [--build build]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=400 SIZES=1M:64M:4 ITERS=10 BUILD=build COLLS="allreduce broadcast allgather reduce_scatter"
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --colls) COLLS=$2; shift 2 ;;
    *) echo "usage: $0 [--rate MBIT] [--sizes MIN:MAX:F] [--iters K] [--colls LIST] [--build DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "hier.sh: needs root (network namespaces)" >&2; exit 2; }
for b in cohortrun cohort-bench; do
  [ -x "$BUILD/bin/$b" ] || { echo "hier.sh: $BUILD/bin/$b missing: run tools/build.sh" >&2; exit 2; }
done
IFS=: read -r MINB MAXB F <<<"$SIZES"
export COHORTRUN=$PWD/$BUILD/bin/cohortrun
OUT=$(mktemp -d /tmp/cohort-hier.XXXXXX)
cat > "$OUT/run.sh" <<EOS
#!/usr/bin/env bash
set -euo pipefail
b() { "$PWD/tests/cluster/cluster.sh" run "\$COHORT_CLUSTER" --timeout 900 -- \\
  "$PWD/$BUILD/bin/cohort-bench" -b $MINB -e $MAXB -f ${F:-4} -n $ITERS -w 2 -c 1 -C "\$1" --csv; }
for coll in $COLLS; do
  COHORT_HIER=0 b \$coll > "$OUT/tcp.\$coll.out" 2>&1
  COHORT_CLUSTER_HOSTS="a a b b" COHORT_HIER=0 b \$coll > "$OUT/flat.\$coll.out" 2>&1
  COHORT_CLUSTER_HOSTS="a a b b" COHORT_HIER=1 b \$coll > "$OUT/hier.\$coll.out" 2>&1
done
EOS
chmod +x "$OUT/run.sh"
tests/cluster/cluster.sh with hb+ 4 --rates "$RATE" -- "$OUT/run.sh" > "$OUT/cluster.log" 2>&1 ||
  { echo "hier.sh: the run failed:"; tail -n 20 "$OUT/cluster.log" "$OUT"/*.out; exit 1; }
echo "hier.sh: 4 ranks (2 hosts x 2), $RATE Mbit/s links, $ITERS iterations; output in $OUT"
for coll in $COLLS; do
echo "$coll:"
printf "%10s %10s %10s %10s %12s %12s\n" bytes tcp flat hier hier/flat hier/tcp
for m in tcp flat hier; do
  grep -hE '^\[0\] (sum|broadcast|allgather|reduce_scatter),[0-9]' "$OUT/$m.$coll.out" | sed 's/^\[0\] //' | awk -F, -v m="$m" '{print m, $2, $6, $8}'
done | awk '{ t[$1 SUBSEP $2] = $3; bw[$1 SUBSEP $2] = $4; s[$2] = 1 }
  END { n = 0; for (k in s) sz[++n] = k + 0
        for (i = 2; i <= n; i++) { v = sz[i]; for (j = i - 1; j >= 1 && sz[j] > v; j--) sz[j + 1] = sz[j]; sz[j + 1] = v }
        for (i = 1; i <= n; i++) { k = sz[i]
          printf "%10d %10.3f %10.3f %10.3f %12.2f %12.2f\n", k, bw["tcp" SUBSEP k], bw["flat" SUBSEP k],
            bw["hier" SUBSEP k], t["flat" SUBSEP k] / t["hier" SUBSEP k], t["tcp" SUBSEP k] / t["hier" SUBSEP k] } }'
done
echo "(busbw in GB/s; hier/flat and hier/tcp: how many times faster hier is)"
