#!/usr/bin/env bash
# cluster.load: cohort-load (tools/cohort_load.c) across the namespace
# cluster while the network misbehaves: 4 ranks, 2 rails each shaped to 300
# Mbit/s, 0.5% of all packets dropped (nftables, the cluster's), and, asked
# of cohort-load itself (--faults): rank 2's eth1 cut for a second at 8 s
# (soft: the link just goes down) and 5% of what reaches rank 1 dropped for
# 3 s at 12 s; then this script cuts rank 2's eth1 hard at 18 s (its TCP
# sockets killed too, a NIC reset). Every collective and sync result must be
# right and no op may fail: the rails fail over and come back, TCP carries
# the drops (about 35 s).
#   test_load.sh COHORT_LOAD
# Exit 77 (skip) when not root or the cluster cannot be built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
load=${1:?usage: test_load.sh path/to/cohort-load}
[ "$(id -u)" = 0 ] || { echo "test_load.sh: SKIP: needs root"; exit 77; }
command -v ss >/dev/null || { echo "test_load.sh: SKIP: no ss (iproute2)"; exit 77; }
out=$(mktemp -d /tmp/cohort-load.XXXXXX)
trap 'rm -rf "$out"' EXIT

cat >"$out/run.sh" <<'EOS'
#!/usr/bin/env bash
set -euo pipefail
here=$1 load=$2 out=$3
C=$COHORT_CLUSTER CL=$here/cluster.sh
eval "$("$CL" env "$C" | grep -E '^COH_(SUBNET|N)=')"
log=$out/load.log
"$CL" run "$C" --timeout 120 -- "$load" --duration 30 --progress 5 --sizes 0:1M \
  --sync-modes allreduce,partial,selective --straggler 3:10 --hang-s 60 \
  --faults cut:2@8:eth1:1000,loss:1@12:5:3000 >"$log" 2>&1 &
pid=$!
for cut in "18 1"; do
  read -r at hard <<<"$cut"
  sleep $((at - ${last:-0}))
  last=$((at + 1))
  echo "cut at ${at} s: rank 2 eth1 down for 1 s ($([ "$hard" = 1 ] && echo hard || echo soft))"
  ip -n "$C-2" link set eth1 down
  [ "$hard" = 1 ] && ip netns exec "$C-2" ss -K -t src "10.$COH_SUBNET.1.3" >/dev/null
  sleep 1
  ip -n "$C-2" link set eth1 up
  ip -n "$C-2" -4 -o addr show dev eth1 | grep -q " 10.$COH_SUBNET.1.3/24 " ||
    ip -n "$C-2" addr add "10.$COH_SUBNET.1.3/24" dev eth1
done
rc=0
wait $pid || rc=$?
echo "cohort-load exit status: $rc"
exit $rc
EOS
chmod +x "$out/run.sh"

set +e
"$here/cluster.sh" with ld+ 4 --nics 2 --rates 300 --loss 0.5 --loss-proto all -- \
  "$out/run.sh" "$here" "$load" "$out"
rc=$?
set -e
[ $rc = 77 ] && exit 77
log=$out/load.log
[ -f "$log" ] && grep -E "SUMMARY|WRONG|HANG|GROWTH|t=|fault|failed over|is back|: failover|: return|cohort-load rank|cohortrun" "$log" | head -80
fail=0
[ $rc = 0 ] || { echo "FAIL: the run failed (status $rc)"; fail=1; }
[ "$(grep -cE 'SUMMARY rank [0-9]+: .* 0 wrong, 0 errors' "$log" 2>/dev/null || true)" = 4 ] ||
  { echo "FAIL: not every rank ended with 0 wrong and 0 errors"; fail=1; }
# the cuts were real: rank 2's links of eth1 failed over (and came back)
grep -q "rank 2: fault: eth1 down" "$log" || { echo "FAIL: cohort-load did not cut eth1"; fail=1; }
grep -q "rank 1: fault: 5.0% of arriving packets dropped" "$log" ||
  { echo "FAIL: cohort-load did not drop packets"; fail=1; }
grep -q "not in a network namespace" "$log" && { echo "FAIL: a network fault was ignored"; fail=1; }
fo=$(sed -n 's/^\[2\] SUMMARY .* \([0-9]*\) rail failovers.*/\1/p' "$log")
[ "${fo:-0}" -gt 0 ] || { echo "FAIL: rank 2 counted no rail failover"; fail=1; }
[ $fail = 0 ] && echo "PASS: 4 ranks, every result right through the drops and cuts ($fo failovers)"
exit $fail
