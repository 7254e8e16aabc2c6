#!/usr/bin/env bash
# cluster.probe: coh_probe measures every link at its shaped rate. Four
# ranks, three behind 400 Mbit links and one behind 100 (one rail), then two
# rails at 300 and 100 Mbit on every rank; test_relay probe prints every link
# it measured (4 MiB each way, so tbf's burst hardly counts). Links between
# fast ranks must come out at 0.25-0.5 Gbps (0.19-0.38 on the 300 Mbit rail),
# links to the slow rank (or on the slow rail) at 0.06-0.14, and the slow ones
# at least 2.5x slower; every link once per end. Under a sanitizer the rates are reported, not judged.
#   test_probe.sh TEST_RELAY
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: test_probe.sh path/to/test_relay}
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 77; }
out=$(mktemp -d /tmp/cohort-probe.XXXXXX)
trap 'rm -rf "$out"' EXIT
run() { # name nranks cluster-args...
  local name=$1
  shift
  set +e
  COHORT_PROBE_EVERY=10 COHORT_PROBE_BYTES=4M "$here/cluster.sh" with "$name" "$@" -- run \
    --timeout 200 -- "$prog" probe 0 > "$out/$name.log" 2>&1
  local rc=$?
  set -e
  [ $rc = 77 ] && exit 77
  [ $rc = 0 ] || { tail -30 "$out/$name.log"; echo "test_probe: the $name run failed ($rc)"; exit 1; }
}
judge() { # log, fast Gbps range lo hi, slow lo hi, awk rule classifying a link slow (r, p, k)
  sed -n 's/.*rank \([0-9]*\) link \([0-9]*\) rail \([0-9]*\): \([0-9.]*\) us \([0-9.]*\) Gbps.*/\1 \2 \3 \5/p' "$1" |
    awk -v timing="${COHORT_TIMING_CHECKS:-1}" -v flo="$2" -v fhi="$3" -v slo="$4" -v shi="$5" '
    { r = $1; p = $2; k = $3; g = $4
      if (seen[r " " p " " k]++) { print "FAIL: link " r "-" p " rail " k " twice"; bad = 1 }
      '"$6"'
      if (slow) { lo = slo; hi = shi; print "slow", g > "'"$out"'/rates" }
      else { lo = flo; hi = fhi; print "fast", g > "'"$out"'/rates" }
      printf "  rank %s -> %s rail %s: %s Gbps (%s)\n", r, p, k, g, slow ? "slow" : "fast"
      if (timing != 0 && (g < lo || g > hi)) { print "FAIL: out of " lo "-" hi; bad = 1 } }
    END { exit bad }'
  local bad=$?
  local mf ms
  mf=$(awk '$1 == "fast" {print $2}' "$out/rates" | sort -g | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : 0}')
  ms=$(awk '$1 == "slow" {print $2}' "$out/rates" | sort -g | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : 0}')
  rm -f "$out/rates"
  echo "  median fast $mf, slow $ms Gbps"
  awk -v f="$mf" -v s="$ms" 'BEGIN { exit !(f > 0 && s > 0) }' || { echo "FAIL: no slow or no fast links"; return 1; }
  if [ "${COHORT_TIMING_CHECKS:-1}" != 0 ]; then
    awk -v f="$mf" -v s="$ms" 'BEGIN { exit !(f >= 2.5 * s) }' || { echo "FAIL: the slow links are not told apart"; return 1; }
  fi
  return $bad
}
run pr+ 4 --rates 400,400,400,100
grep -q "rank 0: OK probe" "$out/pr+.log" || { cat "$out/pr+.log"; exit 1; }
echo "one rail, rank 3 at 100 Mbit:"
judge "$out/pr+.log" 0.25 0.5 0.06 0.14 'slow = (r == 3 || p == 3)'
run pr2+ 4 --nics 2 --rates 300:100,300:100,300:100,300:100
echo "two rails, 300 and 100 Mbit:"
judge "$out/pr2+.log" 0.19 0.38 0.06 0.14 'slow = (k == 1)'
[ "${COHORT_TIMING_CHECKS:-1}" = 0 ] && echo "timing not judged in this build (COHORT_TIMING_CHECKS=0)"
echo "OK"
