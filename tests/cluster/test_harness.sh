#!/usr/bin/env bash
# cluster.harness: cluster.sh builds what it says, the links deliver their
# rates, --loss drops its share, and every way out (down, a failure half-way
# through up, `with` ending, killed by TERM or by KILL then reaped) leaves
# nothing behind. The root namespace's links and nftables rules are compared
# before and after: the harness must never touch them.
# Exit 77 (skip) when not root or when this machine cannot build a cluster.
# Needs $COHORT_CLUSTER_PROBE (the cluster-probe binary).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CL=$HERE/cluster.sh
MS=$HERE/measure.sh
IPBIN=$(command -v ip || echo /usr/sbin/ip)
TCBIN=$(command -v tc || echo /usr/sbin/tc)
[ "$(id -u)" = 0 ] || {
  echo "SKIP: needs root"
  exit 77
}

name=h$$ name_f=f$$ name_w=w$$ name_k=k$$
sleeper=""
cleanup() {
  set +e
  [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null
  for n in "$name" "$name_f" "$name_w" "$name_k"; do "$CL" down "$n" >/dev/null 2>&1; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { printf '\n--- %s\n' "$*"; }
root_state() { # what the root namespace has: link names and the nftables ruleset
  "$IPBIN" -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | sort
  nft list ruleset 2>/dev/null || true
}
# Every namespace of cluster $1 is gone, and its state.
gone() {
  local n
  for n in $("$IPBIN" netns list | awk '{print $1}'); do
    [[ $n != "$1"-* ]] || fail "namespace $n of cluster $1 still exists"
  done
  [ ! -e "${COHORT_CLUSTER_STATE_DIR:-/run/cohort-cluster}/$1.env" ] || fail "state of $1 left"
  [ ! -e "${COHORT_CLUSTER_STATE_DIR:-/run/cohort-cluster}/$1.created" ] || fail "list of $1 left"
}
before=$(root_state)

step "up: 3 ranks, 2 NICs, distinct rates (rank 1's NICs differ), 10% UDP loss"
set +e
"$CL" up "$name" 3 --rates 120,240:80,360 --nics 2 --loss 10
rc=$?
set -e
[ "$rc" != 77 ] || exit 77
[ "$rc" = 0 ] || fail "up exited $rc"
A=$("$CL" env "$name" | sed -n 's/^COH_SUBNET=//p')
rates=("120:120" "240:80" "360:360")

step "objects"
for k in 0 1; do
  "$IPBIN" -n "$name-hub" -4 -o addr show dev "br$k" | grep " 10\.$A\.$k\.254/24 " >/dev/null ||
    fail "hub br$k has no 10.$A.$k.254/24"
done
for i in 0 1 2; do
  IFS=: read -r -a per <<<"${rates[i]}"
  for k in 0 1; do
    "$IPBIN" -n "$name-$i" -4 -o addr show dev "eth$k" | grep " 10\.$A\.$k\.$((i + 1))/24 " >/dev/null ||
      fail "$name-$i eth$k has no 10.$A.$k.$((i + 1))/24"
    "$IPBIN" -n "$name-hub" -o link show dev "r$i-$k" | grep "master br$k" >/dev/null ||
      fail "r$i-$k is not a port of br$k"
    "$TCBIN" -n "$name-$i" qdisc show dev "eth$k" | grep "tbf .*rate ${per[k]}Mbit" >/dev/null ||
      fail "$name-$i eth$k: no tbf at ${per[k]}Mbit"
    "$TCBIN" -n "$name-hub" qdisc show dev "r$i-$k" | grep "tbf .*rate ${per[k]}Mbit" >/dev/null ||
      fail "hub r$i-$k: no tbf at ${per[k]}Mbit"
    # Drops per packet (--loss-unit packet): the hub's port cuts GSO packets.
    "$IPBIN" -n "$name-hub" -d link show dev "r$i-$k" | grep -w "gso_max_segs 1" >/dev/null ||
      fail "hub r$i-$k: GSO packets are not cut (gso_max_segs)"
  done
  ip netns exec "$name-$i" nft list table inet cohort_loss | grep "numgen random mod 10000 < 1000" >/dev/null ||
    fail "$name-$i: no loss rule"
done
"$CL" status "$name"
[ "$(root_state)" = "$before" ] || fail "the root namespace's links or nftables rules changed"

step "TCP rates, each within 25% of the tbf rate"
"$MS" "$name" -t 1 --tolerance 25 || fail "a measured rate is off by more than 25%"

step "UDP loss, within 3 points of 10%"
"$MS" "$name" --udp --count 2000 --tolerance 3 || fail "measured loss is off"

step "down stops what runs inside and removes everything; a second down is a no-op"
"$CL" exec "$name" 1 sleep 60 &
sleeper=$!
for _ in $(seq 50); do # until it is inside the namespace
  [ -z "$("$IPBIN" netns pids "$name-1")" ] || break
  sleep 0.1
done
"$CL" down "$name"
set +e
wait "$sleeper"
rc=$?
set -e
sleeper=""
[ "$rc" -gt 128 ] || fail "the process in $name-1 was not stopped by down (exit $rc)"
gone "$name"
"$CL" down "$name" | grep "not up" >/dev/null || fail "a second down is not a no-op"

step "a failure half-way through up removes what it made, and is a failure (not a skip)"
set +e
COHORT_CLUSTER_TEST_FAIL_RANK=1 "$CL" up "$name_f" 3 --rates 100
rc=$?
set -e
[ "$rc" = 1 ] || fail "up failing at rank 1 exited $rc, expected 1"
gone "$name_f"

step "with: the command's status comes back; the cluster is gone after"
set +e
"$CL" with "$name_w" 2 --rates 100 -- sh -c 'test "$COHORT_CLUSTER" = '"$name_w"' && exit 3'
rc=$?
set -e
[ "$rc" = 3 ] || fail "with exited $rc, expected the command's 3"
gone "$name_w"

step "with, killed by TERM: stops its command and removes the cluster"
"$CL" with "$name_w" 2 --rates 100 -- exec 0 sleep 60 &
pid=$!
for _ in $(seq 50); do
  "$CL" status "$name_w" >/dev/null 2>&1 && break
  sleep 0.1
done
sleep 0.3
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 143 ] || fail "with killed by TERM exited $rc, expected 143"
gone "$name_w"

step "with, killed by KILL: reap removes the cluster and what ran in it"
"$CL" with "$name_k" 2 --rates 100 -- exec 1 sleep 60 &
pid=$!
for _ in $(seq 50); do
  "$CL" status "$name_k" >/dev/null 2>&1 && break
  sleep 0.1
done
sleep 0.3
kill -KILL "$pid"
wait "$pid" || true
# (A `with` running beside this test may reap it first: also a clean-up.)
"$CL" reap
gone "$name_k"

[ "$(root_state)" = "$before" ] || fail "the root namespace's links or nftables rules changed"
echo "cluster.harness: OK"
