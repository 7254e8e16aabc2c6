#!/usr/bin/env bash
# tests/cluster/cluster.sh - a straggler cluster on one machine: N ranks, each
# in its own network namespace, joined by one bridge per NIC index, every
# rank's links shaped by tc tbf to that rank's own rate. Root only.
#
#   cluster.sh up NAME N [options]     create the cluster (see "up options")
#   cluster.sh down NAME               remove everything `up` created; idempotent
#   cluster.sh run NAME [cohortrun options] -- prog args...
#                                      cohortrun with one rank per namespace
#   cluster.sh with NAME N [up options] -- cmd args...
#                                      up, run cmd, down on every exit path;
#                                      exits with cmd's status. NAME+ appends
#                                      this shell's pid (a unique name); cmd may
#                                      be run|exec|status|rates|env|measure ...,
#                                      meaning this script's (or measure.sh's)
#                                      subcommand on this cluster. $COHORT_CLUSTER
#                                      holds the name.
#   cluster.sh status NAME             what exists, qdisc counters; 1 if incomplete
#   cluster.sh rates NAME              per-rank configured rates (Mbit/s)
#   cluster.sh env NAME                the state file (shell assignments)
#   cluster.sh exec NAME RANK|hub cmd args...
#   cluster.sh list                    clusters with a state file
#   cluster.sh reap                    down the clusters whose `with` was killed
#
# up options:
#   --rates R0,R1,...    Mbit/s per rank (one value: every rank). An entry may be
#                        A:B:... with one rate per NIC; 0 or "off": unshaped.
#   --rates-seed S       draw rates like Luo et al.: round(20u, 3) Gbps, u ~ U[L, 1],
#   --rate-max M           scaled so that u = 1 is M Mbit/s (default 800)
#   --lambda L             (default 0.05: the slowest possible rank gets M/20)
#                        Without --rates or --rates-seed every rank gets --rate-max.
#   --nics K             NICs (rails) per rank, eth0..eth<K-1> (default 1, at most 8)
#   --burst B            tbf burst (default 128k: above one 64 KiB GSO packet, so tbf
#                        never has to segment; see README.md)
#   --latency L          tbf latency, i.e. queue length in time (default 20ms)
#   --loss PCT           drop PCT percent (0.01 steps) of the packets arriving at each
#   --loss-proto udp|all   rank with nftables `numgen random`; UDP only by default
#   --loss-unit packet|gso what one draw drops: a packet (default: independent
#                        drops), or a whole GSO packet as the sender's stack made it
#                        (a burst of up to 44 TCP segments or 64 datagrams)
#   --subnet A           second octet of the addresses (default: from NAME's hash)
#
# Layout (all of it outside the root namespace, whose network is never touched):
#   NAME-hub             bridges br<k> with 10.A.k.254/24; rank ports r<i>-<k>
#   NAME-<i>, i < N      lo and eth<k> = 10.A.k.<i+1>/24, the peer of r<i>-<k>
# Rank i's link k is shaped both ways: tbf on eth<k> (rank -> bridge) and on
# r<i>-<k> (bridge -> rank). `run` starts cohortrun inside NAME-hub, so the
# store it binds on 10.A.0.254 is reached by every rank through br0.
#
# Exit status 77 (CTest's skip) when this machine cannot do it: not root, no
# network namespaces, veth, bridges, tbf or (with --loss) nftables.
# State lives in ${COHORT_CLUSTER_STATE_DIR:-/run/cohort-cluster}/NAME.env.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
STATE_DIR=${COHORT_CLUSTER_STATE_DIR:-/run/cohort-cluster}
IPBIN=$(command -v ip || echo /usr/sbin/ip)
TCBIN=$(command -v tc || echo /usr/sbin/tc)

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}
skip() {
  echo "cluster.sh: SKIP: $*" >&2
  exit 77
}
usage() {
  sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

check_name() {
  [[ $1 =~ ^[a-z][a-z0-9_]{0,23}$ ]] ||
    die "cluster name '$1': use 1-24 of [a-z0-9_], starting with a letter"
}
state_file() { echo "$STATE_DIR/$1.env"; }
created_file() { echo "$STATE_DIR/$1.created"; }
ns_exists() { [ -e "/run/netns/$1" ]; }

load_state() { # NAME: source the state file or fail
  local f
  f=$(state_file "$1")
  [ -f "$f" ] || die "no cluster '$1' (no $f)"
  # shellcheck disable=SC1090
  . "$f"
}

# --- rates --------------------------------------------------------------------

# Mbit/s up to 100 Gbit/s (tbf takes 64-bit rates; veth here carries far less), or off.
is_rate() { [[ $1 =~ ^([0-9]{1,6}(\.[0-9]+)?|off)$ ]] && [[ $1 == off || ${1%%.*} -le 100000 ]]; }

# draw_rates N SEED MAX LAMBDA: N rates in Mbit/s, one a line. round(20u, 3) Gbps
# with u ~ U[lambda, 1], times MAX/20. Park-Miller (16807, 2^31-1): every
# product is below 2^53, so any awk computes the same sequence from a seed.
draw_rates() {
  awk -v n="$1" -v seed="$2" -v max="$3" -v lam="$4" 'BEGIN {
    m = 2147483647; x = seed % m; if (x <= 0) x += m - 1
    for (j = 0; j < 8; j++) x = (16807 * x) % m        # spread nearby seeds apart
    for (i = 0; i < n; i++) {
      x = (16807 * x) % m
      u = lam + (1 - lam) * (x / m)
      g = int(20 * u * 1000 + 0.5) / 1000               # round(20u, 3) Gbps
      if (g < 0.001) g = 0.001                          # lambda 0: never 0 (= unshaped)
      printf "%.3f\n", g / 20 * max
    }
  }'
}

# --- up -----------------------------------------------------------------------

cmd_up() {
  local name=${1:-} n=${2:-}
  [ -n "$name" ] && [ -n "$n" ] || usage
  shift 2
  check_name "$name"
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 253 ] || die "N must be 1..253"
  local rates="" seed="" rate_max=800 lambda=0.05 k_nics=1 burst=128k latency=20ms
  local loss=0 loss_proto=udp loss_unit=packet subnet="" owner=0
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "up: $1 needs a value"
    case $1 in
    --rates) rates=$2 ;;
    --rates-seed) seed=$2 ;;
    --rate-max) rate_max=$2 ;;
    --lambda) lambda=$2 ;;
    --nics) k_nics=$2 ;;
    --burst) burst=$2 ;;
    --latency) latency=$2 ;;
    --loss) loss=$2 ;;
    --loss-proto) loss_proto=$2 ;;
    --loss-unit) loss_unit=$2 ;;
    --subnet) subnet=$2 ;;
    --owner-pid) owner=$2 ;; # set by `with`: a dead owner marks the cluster stale
    *) die "up: unknown option $1" ;;
    esac
    shift 2
  done
  [[ $k_nics =~ ^[1-8]$ ]] || die "--nics must be 1..8"
  [[ $rate_max =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--rate-max must be Mbit/s"
  [[ $lambda =~ ^(0(\.[0-9]+)?|1)$ ]] || die "--lambda must be in [0, 1]"
  [[ $burst =~ ^[0-9]+[kKmM]?b?$ ]] || die "--burst must be bytes (e.g. 128k)"
  [[ $latency =~ ^[0-9]+(\.[0-9]+)?(ms|us|s)$ ]] || die "--latency must be a time (e.g. 20ms)"
  [[ $loss =~ ^[0-9]+(\.[0-9]{1,2})?$ ]] && awk -v l="$loss" 'BEGIN{exit !(l <= 100)}' ||
    die "--loss must be a percentage 0..100 with at most 2 decimals"
  [[ $loss_proto =~ ^(udp|all)$ ]] || die "--loss-proto must be udp or all"
  [[ $loss_unit =~ ^(packet|gso)$ ]] || die "--loss-unit must be packet or gso"
  [[ $owner =~ ^[0-9]+$ ]] || die "--owner-pid must be a pid"
  if [ -z "$subnet" ]; then
    subnet=$(($(printf %s "$name" | cksum | cut -d' ' -f1) % 200 + 20))
  fi
  [[ $subnet =~ ^[0-9]+$ ]] && [ "$subnet" -ge 0 ] && [ "$subnet" -le 255 ] ||
    die "--subnet must be 0..255"

  # Per-rank rate lists: R[i] = "r0:r1:..." with one entry per NIC.
  local -a R=()
  local i k
  if [ -n "$seed" ]; then
    [ -z "$rates" ] || die "--rates and --rates-seed exclude each other"
    [[ $seed =~ ^[0-9]+$ ]] || die "--rates-seed must be a non-negative integer"
    mapfile -t R < <(draw_rates "$n" "$seed" "$rate_max" "$lambda")
  else
    [ -n "$rates" ] || rates=$rate_max
    IFS=, read -r -a R <<<"$rates"
    if [ "${#R[@]}" = 1 ] && [ "$n" -gt 1 ]; then
      for ((i = 1; i < n; i++)); do R[i]=${R[0]}; done
    fi
    [ "${#R[@]}" = "$n" ] || die "--rates has ${#R[@]} entries for $n ranks"
  fi
  for ((i = 0; i < n; i++)); do
    local -a per=()
    IFS=: read -r -a per <<<"${R[i]}"
    if [ "${#per[@]}" = 1 ]; then
      for ((k = 1; k < k_nics; k++)); do per[k]=${per[0]}; done
    fi
    [ "${#per[@]}" = "$k_nics" ] || die "rank $i: rate '${R[i]}' needs 1 or $k_nics values"
    for k in "${per[@]}"; do is_rate "$k" || die "rank $i: '$k' is not Mbit/s or off"; done
    R[i]=$(
      IFS=:
      echo "${per[*]}"
    )
  done

  [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veth, tc)"
  mkdir -p "$STATE_DIR"
  local sf cf hub="$name-hub"
  sf=$(state_file "$name")
  cf=$(created_file "$name")
  [ ! -e "$sf" ] || die "cluster '$name' is up (cluster.sh down $name first)"
  if ns_exists "$hub"; then die "namespace $hub exists but is not ours (no $sf)"; fi
  for ((i = 0; i < n; i++)); do
    if ns_exists "$name-$i"; then die "namespace $name-$i exists but is not ours"; fi
  done

  # `ip netns add` fails when the name is taken: the hub is the claim on NAME.
  "$IPBIN" netns add "$hub" || skip "cannot create network namespace $hub"
  echo "ns $hub" >"$cf"
  local nics="" sep=""
  for ((k = 0; k < k_nics; k++)); do
    nics+="${sep}eth$k"
    sep=,
  done
  cat >"$sf" <<EOF
COH_NAME=$name
COH_N=$n
COH_K=$k_nics
COH_SUBNET=$subnet
COH_HUB=$hub
COH_STORE_HOST=10.$subnet.0.254
COH_NICS=$nics
COH_RATES="${R[*]}"
COH_SEED=${seed:-none}
COH_RATE_MAX=$rate_max
COH_LAMBDA=$lambda
COH_BURST=$burst
COH_LATENCY=$latency
COH_LOSS=$loss
COH_LOSS_PROTO=$loss_proto
COH_LOSS_UNIT=$loss_unit
COH_OWNER_PID=$owner
COH_COMPLETE=0
EOF
  # Built in a subshell under set -e: any failing step ends it, and then
  # everything made so far is removed. A signal here is acted on once the
  # subshell has ended (Ctrl-C reaches both; a TERM to this shell waits).
  local rc sig="" what=""
  trap 'sig=130' INT
  trap 'sig=143' TERM
  # What this machine cannot do is a skip (77), not a test failure: try each
  # kind of object once, with known-good arguments, before building.
  what=$(preflight "$hub" "$loss") || rc=$?
  if [ -z "$what" ] && [ -z "$sig" ]; then
    set +e
    (
      set -e
      up_build "$name" "$n" "$k_nics" "$subnet" "$burst" "$latency" "$loss" "$loss_proto" \
        "$loss_unit" "${R[@]}"
    )
    rc=$?
    set -e
  fi
  trap - INT TERM
  if [ -n "$what" ] || [ "${rc:-0}" != 0 ] || [ -n "$sig" ]; then
    echo "cluster.sh: up $name failed${sig:+ (signal)}; removing what it made" >&2
    cmd_down "$name" >/dev/null 2>&1 || true
    [ -z "$sig" ] || exit "$sig"
    [ -z "$what" ] || skip "this machine cannot create $what"
    exit "$rc"
  fi
  sed -i 's/^COH_COMPLETE=0$/COH_COMPLETE=1/' "$sf"
  echo "cluster $name: $n ranks x $k_nics NIC(s), 10.$subnet.k.<rank+1>, store $hub 10.$subnet.0.254"
  cmd_rates "$name"
}

# preflight HUB LOSS: in the (empty) hub namespace, make and remove one of
# each kind of object `up` needs; prints the first one that fails.
preflight() {
  local hub=$1 loss=$2
  local H=("$IPBIN" -n "$1")
  if ! "${H[@]}" link add pfbr type bridge; then
    echo "a bridge"
  elif ! "${H[@]}" link add pf0 type veth peer name pf1; then
    echo "a veth pair"
  elif ! "$TCBIN" -n "$hub" qdisc add dev pf0 root tbf rate 100mbit burst 128k latency 20ms; then
    echo "a tbf qdisc"
  elif [ "$loss" != 0 ] && ! ip netns exec "$hub" nft -f - <<<'table inet cohort_pf {
      chain c { type filter hook input priority 0; numgen random mod 100 < 1 drop; }
    }'; then
    echo "an nftables numgen rule"
  elif [ "$loss" != 0 ] && ! "${H[@]}" link set pf0 gso_max_segs 1; then
    echo "a link's gso_max_segs (use --loss-unit gso)"
  fi
  ip netns exec "$hub" nft delete table inet cohort_pf 2>/dev/null || true
  "${H[@]}" link del pf0 2>/dev/null || true
  "${H[@]}" link del pfbr 2>/dev/null || true
}

# up_build NAME N K SUBNET BURST LATENCY LOSS LOSS_PROTO LOSS_UNIT RATES...: runs in a
# subshell under set -e; every namespace it makes is listed in NAME.created
# before anything is put in it.
up_build() {
  local name=$1 n=$2 k_nics=$3 subnet=$4 burst=$5 latency=$6 loss=$7 loss_proto=$8
  local loss_unit=$9
  shift 9
  local -a R=("$@")
  local hub="$name-hub" cf i k
  cf=$(created_file "$name")
  local H=("$IPBIN" -n "$hub")
  "${H[@]}" link set lo up
  # The bridges' namespace has no firewall rules at all; turning bridge
  # netfilter off here (a per-namespace setting) also saves its hook calls.
  # IPv6 is off so that no router solicitations or DAD spend tbf tokens.
  ip netns exec "$hub" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do
      [ -w "$f" ] && echo 0 >"$f"; done; echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6;
      echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true
  for ((k = 0; k < k_nics; k++)); do
    "${H[@]}" link add "br$k" type bridge stp_state 0 mcast_snooping 0
    "${H[@]}" addr add "10.$subnet.$k.254/24" dev "br$k"
    "${H[@]}" link set "br$k" up
  done

  for ((i = 0; i < n; i++)); do
    local ns="$name-$i" rate
    "$IPBIN" netns add "$ns"
    echo "ns $ns" >>"$cf"
    # Test hook (test_harness.sh): fail half-way through, to check the clean-up.
    [ "${COHORT_CLUSTER_TEST_FAIL_RANK:-}" != "$i" ] || {
      echo "cluster.sh: failing at rank $i (COHORT_CLUSTER_TEST_FAIL_RANK)" >&2
      false
    }
    "$IPBIN" -n "$ns" link set lo up
    ip netns exec "$ns" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6;
      echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true
    local -a per=()
    IFS=: read -r -a per <<<"${R[i]}"
    for ((k = 0; k < k_nics; k++)); do
      "${H[@]}" link add "r$i-$k" type veth peer name "eth$k" netns "$ns"
      "${H[@]}" link set "r$i-$k" master "br$k" up
      "$IPBIN" -n "$ns" addr add "10.$subnet.$k.$((i + 1))/24" dev "eth$k"
      "$IPBIN" -n "$ns" link set "eth$k" up
      if [ "$loss_unit" = packet ] && [ "$loss" != 0 ] && ! [[ $loss =~ ^0+(\.0+)?$ ]]; then
        # A GSO packet (up to 44 TCP segments, or 64 UDP datagrams) crosses
        # veth and the bridge whole, and nftables drops it as one. For drops
        # per packet the hub's port to the rank cuts them (gso_max_segs 1),
        # after its tbf, which still sees them whole. Not the rank's own
        # device: TCP would then build one-segment packets, and the senders'
        # CPU (not the loss) made tcp 1.6x slower at 0.01% drops.
        "${H[@]}" link set "r$i-$k" gso_max_segs 1
      fi
      rate=${per[k]}
      if [ "$rate" != off ] && [ "$rate" != 0 ] && ! [[ $rate =~ ^0+(\.0+)?$ ]]; then
        "$TCBIN" -n "$ns" qdisc add dev "eth$k" root tbf rate "${rate}mbit" burst "$burst" \
          latency "$latency"
        "$TCBIN" -n "$hub" qdisc add dev "r$i-$k" root tbf rate "${rate}mbit" burst "$burst" \
          latency "$latency"
      fi
    done
    if [ "$loss" != 0 ] && ! [[ $loss =~ ^0+(\.0+)?$ ]]; then
      # Dropped on arrival (input hook): silent to the sender, whereas a drop in
      # the output hook would fail its sendmsg with EPERM.
      local per10k match=""
      per10k=$(awk -v l="$loss" 'BEGIN{printf "%d", l * 100 + 0.5}')
      [ "$loss_proto" = udp ] && match="meta l4proto udp "
      ip netns exec "$ns" nft -f - <<EOF
table inet cohort_loss {
  chain input {
    type filter hook input priority 0; policy accept;
    ${match}numgen random mod 10000 < $per10k counter drop
  }
}
EOF
    fi
  done
  # The kernel keeps one ARP table for every namespace, gc_thresh3 (1024)
  # entries in all: 32 ranks that all talk to each other need 32 x 31 + 32,
  # and the next SYNs go nowhere ("neighbor table overflow"; 32 ranks failed
  # to connect, 31 did not). Permanent entries do not count against it, and
  # setting them here leaves the root namespace's sysctls alone.
  if ((n * n * k_nics > 512)); then
    local -a mac=()
    for ((i = 0; i < n; i++)); do
      for ((k = 0; k < k_nics; k++)); do
        mac[i * k_nics + k]=$(ip netns exec "$name-$i" cat "/sys/class/net/eth$k/address")
      done
    done
    local -a brmac=()
    for ((k = 0; k < k_nics; k++)); do
      brmac[k]=$(ip netns exec "$hub" cat "/sys/class/net/br$k/address")
    done
    for ((j = 0; j < n; j++)); do
      {
        for ((k = 0; k < k_nics; k++)); do
          echo "neigh replace 10.$subnet.$k.254 lladdr ${brmac[k]} dev eth$k nud permanent"
          for ((i = 0; i < n; i++)); do
            ((i == j)) && continue
            echo "neigh replace 10.$subnet.$k.$((i + 1)) lladdr ${mac[i * k_nics + k]} dev eth$k nud permanent"
          done
        done
      } | "$IPBIN" -n "$name-$j" -batch -
    done
  fi
}

# --- down ---------------------------------------------------------------------

kill_ns_pids() { # NS: stop whatever still runs in a namespace we created
  local ns=$1 pids
  pids=$("$IPBIN" netns pids "$ns" 2>/dev/null | tr '\n' ' ') || return 0
  [ -n "${pids// /}" ] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$("$IPBIN" netns pids "$ns" 2>/dev/null | tr '\n' ' ') || return 0
    [ -n "${pids// /}" ] || return 0
    sleep 0.2
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}

cmd_down() {
  local name=${1:-}
  [ -n "$name" ] || usage
  check_name "$name"
  [ "$(id -u)" = 0 ] || skip "needs root"
  local sf cf
  sf=$(state_file "$name")
  cf=$(created_file "$name")
  if [ ! -e "$sf" ] && [ ! -e "$cf" ]; then
    echo "cluster $name: not up"
    return 0
  fi
  # Only the namespaces listed in NAME.created were made by `up`; everything
  # else it made lives inside them and goes with them.
  local -a made=()
  [ -e "$cf" ] && mapfile -t made < <(awk '$1 == "ns" {print $2}' "$cf")
  local ns i l
  for ns in "${made[@]}"; do
    ! ns_exists "$ns" || kill_ns_pids "$ns"
  done
  # The hub's veths first: deleting one end deletes its peer in the rank at
  # once, whereas a deleted namespace's devices go asynchronously, later.
  if [ "${#made[@]}" -gt 0 ] && [ "${made[0]}" = "$name-hub" ] && ns_exists "$name-hub"; then
    for l in $("$IPBIN" -n "$name-hub" -o link show 2>/dev/null |
      awk -F': ' '{sub(/@.*/, "", $2); print $2}'); do
      if [[ $l =~ ^(r[0-9]+-[0-9]|br[0-9])$ ]]; then
        "$IPBIN" -n "$name-hub" link del "$l" 2>/dev/null || true
      fi
    done
  fi
  for ((i = ${#made[@]} - 1; i >= 0; i--)); do
    ns=${made[i]}
    ns_exists "$ns" || continue
    "$IPBIN" netns del "$ns" 2>/dev/null || ! ns_exists "$ns" || die "cannot delete namespace $ns"
  done
  rm -f "$sf" "$cf"
  echo "cluster $name: down"
}

# --- the rest -----------------------------------------------------------------

cmd_rates() {
  load_state "${1:-}"
  local i=0 k r
  local -a per
  for r in $COH_RATES; do
    IFS=: read -r -a per <<<"$r"
    printf 'rank %d' "$i"
    for ((k = 0; k < COH_K; k++)); do
      printf '  eth%d %s' "$k" "${per[k]}"
      [ "${per[k]}" = off ] || printf ' Mbit/s'
    done
    printf '\n'
    i=$((i + 1))
  done
}

qdisc_line() { # NS DEV: "tbf 100Mbit, 123 bytes sent, 0 dropped" (or "unshaped")
  "$TCBIN" -s -n "$1" qdisc show dev "$2" 2>/dev/null | awk '
    /^qdisc tbf/ {q = "tbf " $8} /^qdisc/ && !q {q = "unshaped"}
    /Sent/ {s = $2; d = $7; sub(/,/, "", d)}
    END {printf "%s, %s bytes sent, %s dropped", q, s, d}'
}

cmd_status() {
  local name=${1:-}
  [ -n "$name" ] || usage
  load_state "$name"
  local ok=0 i k
  echo "cluster $name: $COH_N ranks x $COH_K NIC(s), subnet 10.$COH_SUBNET.0.0/16," \
    "store $COH_STORE_HOST, complete=$COH_COMPLETE, loss=$COH_LOSS% ($COH_LOSS_PROTO, per ${COH_LOSS_UNIT:-packet})"
  ns_exists "$COH_HUB" || {
    echo "  MISSING namespace $COH_HUB"
    ok=1
  }
  for ((i = 0; i < COH_N; i++)); do
    local ns="$COH_NAME-$i"
    if ! ns_exists "$ns"; then
      echo "  MISSING namespace $ns"
      ok=1
      continue
    fi
    for ((k = 0; k < COH_K; k++)); do
      local addr
      addr=$("$IPBIN" -n "$ns" -4 -o addr show dev "eth$k" 2>/dev/null | awk '{print $4}')
      echo "  $ns eth$k ${addr:-NO ADDRESS}  up: $(qdisc_line "$ns" "eth$k")" \
        " down: $(qdisc_line "$COH_HUB" "r$i-$k")"
      [ -n "$addr" ] || ok=1
    done
    if [ "$COH_LOSS" != 0 ]; then
      echo "  $ns loss rule: $(ip netns exec "$ns" nft list table inet cohort_loss 2>/dev/null |
        awk '/counter/ {for (j = 1; j < NF; j++) if ($j == "packets") p = $(j + 1)}
             END {print (p == "" ? "MISSING" : p " packets dropped")}')"
    fi
  done
  return $ok
}

cmd_run() {
  local name=${1:-}
  [ -n "$name" ] || usage
  shift
  load_state "$name"
  [ "$COH_COMPLETE" = 1 ] || die "cluster $name is not completely up"
  local launcher=${COHORTRUN:-$REPO/build/bin/cohortrun}
  [ -x "$launcher" ] || die "no launcher at $launcher (build it, or set COHORTRUN)"
  # The store socket is bound inside the hub (cohortrun runs there) and
  # inherited by rank 0; the other ranks reach 10.A.0.254 through br0.
  # Options given here come after ours, so they win (e.g. -n 2, --nics eth1).
  export COHORT_CLUSTER=$name COHORT_CLUSTER_STATE
  COHORT_CLUSTER_STATE=$(state_file "$name")
  exec "$IPBIN" netns exec "$COH_HUB" "$launcher" -n "$COH_N" \
    --wrap "$IPBIN netns exec $COH_NAME-{rank} $HERE/host_env.sh {rank}" \
    --store-host "$COH_STORE_HOST" \
    --nics "$COH_NICS" "$@"
}

cmd_exec() {
  local name=${1:-} who=${2:-}
  [ -n "$name" ] && [ -n "$who" ] && [ $# -ge 3 ] || usage
  shift 2
  load_state "$name"
  local ns
  if [ "$who" = hub ]; then
    ns=$COH_HUB
  elif [[ $who =~ ^[0-9]+$ ]] && [ "$who" -lt "$COH_N" ]; then
    ns=$COH_NAME-$who
  else
    die "exec: '$who' is neither a rank below $COH_N nor hub"
  fi
  exec "$IPBIN" netns exec "$ns" "$@"
}

# owner_of NAME: the pid recorded by the `with` that made it (0: made by `up`)
owner_of() {
  awk -F= '$1 == "COH_OWNER_PID" {print $2}' "$(state_file "$1")" 2>/dev/null || true
}

# Clusters whose `with` is gone (killed by SIGKILL, e.g. a CTest timeout, so
# its traps never ran) are removed; those made by a plain `up` are left alone.
# /proc, not kill -0: kill -0 also fails for a live process we may not signal.
cmd_reap() {
  [ "$(id -u)" = 0 ] || skip "needs root"
  local f nm owner
  for f in "$STATE_DIR"/*.env; do
    [ -e "$f" ] || continue
    nm=$(basename "$f" .env)
    owner=$(owner_of "$nm")
    if [[ $owner =~ ^[1-9][0-9]*$ ]] && [ ! -d "/proc/$owner" ]; then
      echo "cluster.sh: removing stale cluster $nm (its owner, pid $owner, is gone)" >&2
      cmd_down "$nm" >/dev/null
    fi
  done
}

cmd_with() {
  local name=${1:-} n=${2:-}
  [ -n "$name" ] && [ -n "$n" ] || usage
  shift 2
  local -a upargs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    upargs+=("$1")
    shift
  done
  [ "${1:-}" = -- ] && [ $# -ge 2 ] || die "with: need -- cmd args..."
  shift
  # NAME+ : a name of its own, so that concurrent runs of one test never meet.
  [[ $name != *+ ]] || name="${name%+}$$"
  check_name "$name"
  # The command may be one of ours, run on this cluster: run, exec, status,
  # rates, env, or measure (measure.sh).
  case $1 in
  run | exec | status | rates | env) set -- "$SELF" "$1" "$name" "${@:2}" ;;
  measure) set -- "$HERE/measure.sh" "$name" "${@:2}" ;;
  esac
  [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veth, tc)"
  cmd_reap
  local rc=0 child=""
  cleanup() {
    trap - EXIT INT TERM HUP
    set +e # every step of the clean-up runs, whatever the one before it did
    if [ -n "$child" ]; then
      kill -TERM "$child" 2>/dev/null
      wait "$child" 2>/dev/null
    fi
    # Only a cluster this `with` made: not one that `up` refused to replace.
    if [ "$(owner_of "$name")" = $$ ]; then
      cmd_down "$name" >/dev/null 2>&1 || echo "cluster.sh: down $name failed" >&2
    fi
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  # up runs in a subshell so that its traps and exits stay its own; not under
  # `||`, which would switch set -e off inside it.
  set +e
  (cmd_up "$name" "$n" "${upargs[@]}" --owner-pid $$)
  rc=$?
  set -e
  [ "$rc" = 0 ] || exit "$rc"
  export COHORT_CLUSTER=$name
  # In the background, so that a signal to this shell is handled at once
  # (bash defers traps while a foreground child runs).
  "$@" &
  child=$!
  wait "$child" || rc=$?
  child=""
  exit "$rc"
}

cmd_list() {
  local f
  for f in "$STATE_DIR"/*.env; do
    [ -e "$f" ] || continue
    (
      # shellcheck disable=SC1090
      . "$f"
      echo "$COH_NAME: $COH_N ranks x $COH_K NIC(s), 10.$COH_SUBNET.k.x, rates $COH_RATES"
    )
  done
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
case $cmd in
up) cmd_up "$@" ;;
down) cmd_down "$@" ;;
run) cmd_run "$@" ;;
with) cmd_with "$@" ;;
status) cmd_status "$@" ;;
rates) cmd_rates "$@" ;;
env) cat "$(state_file "${1:?cluster.sh env NAME}")" ;;
exec) cmd_exec "$@" ;;
list) cmd_list ;;
reap) cmd_reap ;;
-h | --help | help) usage ;;
*) die "unknown command '$cmd' (up, down, run, with, status, rates, env, exec, list, reap)" ;;
esac
