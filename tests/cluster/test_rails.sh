#!/usr/bin/env bash
# cluster.rails.failover / cluster.rails.nics3: multi-rail failover under load.
#
#   test_rails.sh RAILS_STREAM [--nics K] [--verbs]   (K = 2 or 3; default 2)
#
# --verbs: rail 1 (eth1) is a verbs rail on the soft provider (eth0 stays
# TCP): a cut fails its QPs (the cut rank's at once: its port goes down with
# eth1 and the provider says so in an asynchronous event; a peer's by the
# retry timer or the cut rank's poke; held down 2.5 s). Its links resume on new
# QP pairs on the RDMA device behind eth0 (the soft provider's port follows
# its interface: eth1's is down), and move back once eth1 is up
# (docs/verbs.md, failover). The last cut lasts 7 s, longer than a link
# waits for its own device (5 s): the links must have moved, and ops must
# complete while it lasts (with COHORT_VERBS_MOVE=0 that cut fails: the
# links to the cut rank end and their ops fail). Every cut must fail links
# on the port's asynchronous event. A fifth cut blackholes rank 0's eth1 for
# 6 s (nftables drops all it sends and receives; the interface stays up, so
# no port event, and the links fail on the retry timer): the links must
# move because their dials and the peers' pokes through eth1 go unanswered,
# and move back after (one poke with no deadline held the others back until
# the link was lost).
#
# Four ranks, K rails each, every rail shaped to 300 Mbit/s. rails-stream runs
# 4 MiB f32 sum allreduces one after the other, checking every element
# exactly (integer-valued floats), until this script is done cutting. Meanwhile
# the script cuts a rail (never eth0: the store and the coordinator live there)
# of one rank, holds it down about a second and brings it back, several times:
#   - soft cut: `ip link set ethK down`; the sockets stay open and TCP just
#     retransmits into nothing, so only the engine's stall detection
#     (COHORT_RAIL_STALL_MS) can notice;
#   - hard cut: the same, plus `ss -K` of the rank's TCP sockets on that
#     interface (a NIC reset): the sockets fail at once.
# With K = 3 one cut takes eth1 and eth2 of a rank down together, so its links
# of both rails must end up on eth0. After `up` the interface's address, route
# and tbf qdisc are checked (and the address and route put back if the kernel
# dropped them). Before the next cut the script waits until every link that
# failed over is back (as many return as failover log lines), and until the
# ops take at most 1.3x their time before the cuts again (the rails carry
# their shares again).
#
# Passes only if: the stream ended by itself with status 0 (no op failed, no
# wrong element, no request counted failed), every cut produced a failover,
# a return was logged after the last cut, and the ops were back at their
# speed before the cuts after every cut. About 30-45 s.
# With COHORT_RAIL_FAILOVER=0 in the environment it fails: the hard cut fails
# the ops on that link (EPEER), and no failover is logged for the soft ones.
# Exit 77 (skip) when not root or the cluster cannot be built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stream=${1:?usage: test_rails.sh path/to/rails-stream [--nics K]}
shift
nics=2 verbs=0
while [ $# -gt 0 ]; do
  case $1 in
  --nics) nics=$2; shift ;;
  --verbs) verbs=1 ;;
  *) echo "test_rails.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $nics =~ ^[23]$ ]] || { echo "test_rails.sh: --nics must be 2 or 3" >&2; exit 2; }
[ "$verbs" = 0 ] || [ "$nics" = 2 ] || { echo "test_rails.sh: --verbs is for --nics 2" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "test_rails.sh: SKIP: needs root"; exit 77; }
[ -x "$stream" ] || { echo "test_rails.sh: no $stream" >&2; exit 1; }
command -v ss >/dev/null || { echo "test_rails.sh: SKIP: no ss (iproute2)"; exit 77; }
FO='link to rank [0-9]+ failed over|: failover \(' BACK='link to rank [0-9]+ is back|: return \('
out=$(mktemp -d /tmp/cohort-rails.XXXXXX)
trap 'rm -rf "$out"' EXIT

# The part that runs inside the cluster (cluster.sh with ... -- run.sh).
cat >"$out/run.sh" <<'EOS'
#!/usr/bin/env bash
set -euo pipefail
here=$1 stream=$2 out=$3 nics=$4 verbs=$5
C=$COHORT_CLUSTER CL=$here/cluster.sh
eval "$("$CL" env "$C" | grep -E '^COH_(SUBNET|N)=')"
mono() { /usr/bin/python3 -c 'import time; print("%.3f" % time.monotonic())'; }
log=$out/stream.log
# rank 0's op lines: "[0] op,size,i,t_start,t_end,ms"
base_ms() { # the median op time of ops 2..7 (before any cut)
  awk -F, '/^\[0\] op,/ && $3 >= 2 && $3 <= 7 { a[n++] = $6 }
    END { if (n == 0) { print 0; exit }
      for (i = 1; i < n; i++) for (j = i; j > 0 && a[j] < a[j - 1]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
      print a[int((n - 1) / 2)] }' "$log"
}
recovered() { # T BASE: the last 3 ops that started after T took <= 1.3 x BASE
  awk -F, -v t="$1" -v b="$2" '/^\[0\] op,/ && $4 > t { n++; a[n] = $6 }
    END { if (n < 3) exit 1; for (i = n - 2; i <= n; i++) if (a[i] > 1.3 * b) exit 1 }' "$log"
}
count() { grep -cE -- "$1" "$log" || true; }
# The engine logs "failed over" / "is back"; with the reactor's observer the
# lines read "link to rank P: failover (now via ..." / "...: return (now via".
FO='link to rank [0-9]+ failed over|: failover \(' BACK='link to rank [0-9]+ is back|: return \('

# ip link set DEV up, then make sure the address, the prefix route and the
# tbf are there (the kernel keeps IPv4 addresses over down/up; if it ever
# does not, put them back rather than leave the rail dead).
bring_up() { # RANK DEV
  local ns=$C-$1 dev=$2 k=${2#eth} addr
  ip -n "$ns" link set "$dev" up
  addr=10.$COH_SUBNET.$k.$(($1 + 1))
  if ! ip -n "$ns" -4 -o addr show dev "$dev" | grep -q " $addr/24 "; then
    echo "note: $ns $dev lost $addr on down/up: re-added"
    ip -n "$ns" addr add "$addr/24" dev "$dev"
  fi
  if ! ip -n "$ns" -4 route show "10.$COH_SUBNET.$k.0/24" | grep -q "dev $dev"; then
    echo "note: $ns $dev lost its route on down/up: re-added"
    ip -n "$ns" route add "10.$COH_SUBNET.$k.0/24" dev "$dev" src "$addr" || true
  fi
  tc -n "$ns" qdisc show dev "$dev" | grep -q '^qdisc tbf' ||
    { echo "FAIL: $ns $dev lost its tbf qdisc on down/up"; return 1; }
}

cut() { # RANK HARD DEV... (HARD 2: a blackhole, the interface up)
  local r=$1 hard=$2 ns=$C-$1 d
  shift 2
  if [ "$hard" = 2 ]; then
    for d in "$@"; do
      ip netns exec "$ns" nft -f - <<<"table inet cohort_cut_$d {
        chain i { type filter hook input priority 0; iifname \"$d\" drop; }
        chain o { type filter hook output priority 0; oifname \"$d\" drop; }
      }"
    done
    return
  fi
  for d in "$@"; do ip -n "$ns" link set "$d" down; done
  if [ "$hard" = 1 ]; then
    for d in "$@"; do
      ip netns exec "$ns" ss -K -t src "10.$COH_SUBNET.${d#eth}.$((r + 1))" >/dev/null
    done
  fi
}

hold=1 railargs=()
if [ "$verbs" = 1 ]; then
  hold=2.5 railargs=(--nics eth0,eth1:verbs)
  export COHORT_VERBS_PROVIDER=soft
fi
"$CL" run "$C" --timeout 100 "${railargs[@]}" -- "$stream" --bytes 4M --ops 2000 --warmup 2 --csv \
  --stop-file "$out/stop" >"$log" 2>&1 &
pid=$!
# The stream is running once rank 0 printed its first ops.
for ((i = 0; i < 300; i++)); do
  [ "$(grep -c '^\[0\] op,' "$log" || true)" -ge 5 ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
base=$(base_ms)
echo "op time before the cuts: ${base:-?} ms"
if [ "$nics" = 2 ] && [ "$verbs" = 1 ]; then
  plan=("2 0 eth1" "1 1 eth1" "3 0 eth1" "2 1 eth1" "0 2 eth1")
elif [ "$nics" = 2 ]; then
  plan=("2 0 eth1" "1 1 eth1" "3 0 eth1" "2 1 eth1")
else
  plan=("2 0 eth1" "1 1 eth2" "3 0 eth1 eth2" "0 1 eth2")
fi
# COHORT_RAILS_TEST_CUTS=n: only the first n cuts (for debugging)
plan=("${plan[@]:0:${COHORT_RAILS_TEST_CUTS:-${#plan[@]}}}")
rc=0 ncut=0
long=7 # --verbs: the 4th cut's hold (longer than COHORT_VERBS_RESUME_MS)
for p in "${plan[@]}"; do
  kill -0 $pid 2>/dev/null || { echo "FAIL: the stream ended during the cuts"; rc=1; break; }
  read -r r hard devs <<<"$p"
  fo0=$(count "$FO") ae0=$(count 'asynchronous event') mv0=$(count 'moved to soft_eth0')
  ncut=$((ncut + 1))
  # A cut must hit a rail that carries traffic: under ASan the balancer
  # once left rail 1 idle for 1.8 s after a return (ops at one rail's
  # time, no failover anywhere), and a soft cut in that time had nothing
  # to fail over. So: the last ops at both rails' time first, and a cut
  # that moved no link is made once more (a second miss fails).
  h=$hold
  [ "$verbs" = 1 ] && [ "$ncut" = 4 ] && h=$long
  [ "$hard" = 2 ] && h=6
  for try in 1 2; do
    sleep 0.7
    for ((i = 0; i < 100; i++)); do recovered 0 "$base" && break; sleep 0.1; done
    t=$(mono)
    how=soft
    [ "$hard" = 1 ] && how='hard: sockets killed'
    [ "$hard" = 2 ] && how='blackhole: all dropped, the interface up'
    echo "cut $ncut at $t: rank $r ${devs// /+} down for $h s ($how)"
    # shellcheck disable=SC2086
    cut "$r" "$hard" $devs
    echo "$t" >>"$out/cuts"
    sleep "$h"
    [ "$h" = "$long" ] && echo "$t $(mono)" >"$out/longcut"
    [ "$hard" = 2 ] && echo "$t $(mono)" >"$out/blackhole"
    for d in $devs; do
      if [ "$hard" = 2 ]; then
        ip netns exec "$C-$r" nft delete table inet "cohort_cut_$d"
      else
        bring_up "$r" "$d" || rc=1
      fi
    done
    # Wait (at most 6 s) for the failover of this cut and the links' return.
    for ((i = 0; i < 60; i++)); do
      fo=$(count "$FO") back=$(count "$BACK")
      [ "$fo" -gt "$fo0" ] && [ "$back" -ge "$fo" ] && break
      sleep 0.1
    done
    fo=$(count "$FO") back=$(count "$BACK")
    echo "  failed over: $((fo - fo0)) link ends; is back: $back of $fo so far"
    [ "$fo" -gt "$fo0" ] && break
    [ "$try" = 1 ] && echo "  no link failed over: once more"
  done
  [ "$fo" -gt "$fo0" ] || { echo "FAIL: cut $ncut: no link failed over"; rc=1; }
  # --verbs: the cut rank's port went down with eth1, and its links failed
  # on that event, not seconds later on the retry timer.
  # The blackhole: no event (the port stays up), but the links must move.
  if [ "$hard" = 2 ] && [ "$(count 'moved to soft_eth0')" -le "$mv0" ]; then
    echo "FAIL: cut $ncut: no link moved while eth1 was a blackhole"
    rc=1
  fi
  if [ "$verbs" = 1 ] && [ "$hard" != 2 ] && [ "$(count 'asynchronous event')" -le "$ae0" ]; then
    echo "FAIL: cut $ncut: no link failed on the port's asynchronous event"
    rc=1
  fi
  # ... and until the rails carry their shares again (the balancer leaves a
  # rail that failed over out of its splits until it is back), so that the
  # next cut hits a busy rail: 3 ops in a row at <= 1.3x the time before.
  tup=$(mono) ok=0
  for ((i = 0; i < 100; i++)); do
    recovered "$tup" "$base" && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if [ $ok = 1 ]; then
    echo "  ops back at their time before the cuts ($(awk -v a="$tup" -v b="$(mono)" 'BEGIN { printf "%.1f", b - a }') s after the return)"
  elif ! kill -0 $pid 2>/dev/null; then
    echo "FAIL: cut $ncut: the stream ended (an op failed: see below)"
    rc=1
  elif [ "${COHORT_TIMING_CHECKS:-1}" = 0 ]; then
    # Sanitizer builds: the ranks' CPU, not the links, sets the op time.
    echo "  ops not back at ${base} ms x 1.3 within 10 s (timing not judged in this build)"
  else
    echo "FAIL: cut $ncut: the ops did not come back to ${base} ms x 1.3 within 10 s"
    rc=1
  fi
done
mono >"$out/stop"
src=0
wait $pid || src=$?
echo "stream exit status: $src"
[ "$src" = 0 ] || rc=1
exit $rc
EOS
chmod +x "$out/run.sh"

t0=$(date +%s)
set +e
"$here/cluster.sh" with rl+ 4 --nics "$nics" --rates 300 -- "$out/run.sh" "$here" "$stream" "$out" "$nics" "$verbs"
rc=$?
set -e
[ $rc = 77 ] && exit 77
log=$out/stream.log
[ -f "$log" ] || { echo "FAIL: no stream log (cluster failed? status $rc)"; exit 1; }
echo "--- rails events and failures:"
grep -E "$FO|$BACK|is gone|: gone|FAIL|WRONG|failed" "$log" | head -80 || true
echo "---"
fail=0
[ $rc = 0 ] || { echo "FAIL: the run failed (status $rc)"; fail=1; }
grep -q 'rails-stream: OK' "$log" || { echo "FAIL: rails-stream did not finish OK"; fail=1; }
grep -qE 'FAIL|WRONG' "$log" && { echo "FAIL: an op failed or a result was wrong"; fail=1; }
stats=$(grep '^\[0\] stats,' "$log" | tail -1 | cut -d, -f2 || true)
if grep -q 'rails-stream: OK' "$log" && [ "${stats:-x}" != 0 ]; then
  echo "FAIL: rank 0 counted ${stats:-no} failed requests"
  fail=1
fi
fo=$(grep -cE "$FO" "$log" || true)
back=$(grep -cE "$BACK" "$log" || true)
[ "$fo" -gt 0 ] || { echo "FAIL: no link failed over"; fail=1; }
[ "$back" -gt 0 ] || { echo "FAIL: no link came back"; fail=1; }
# A verbs link that could not resume ends (gone) even when no op was on it
# then: with --verbs none may (the higher rank pokes a peer that did not notice).
# (Before the stream was told to stop: links close at finalize.)
tstop=$(cat "$out/stop" 2>/dev/null || echo 0)
if [ "$verbs" = 1 ] && grep -E 'is gone|: gone \(|WARN .*lost rank' "$log" |
  awk -v t="$tstop" '$2 + 0 < t + 0 { f = 1 } END { exit !f }'; then
  echo "FAIL: a link was lost"
  fail=1
fi
# --verbs: the links moved to eth0's RDMA device, and during the long cut
# the op in flight when it began ended before eth1 came back (on its own
# device it would have waited for the interface, 5 s at most, then failed).
if [ "$verbs" = 1 ]; then
  moved=$(grep -c 'moved to soft_eth0' "$log" || true)
  read -r l0 l1 <"$out/longcut" 2>/dev/null || { l0=0 l1=0; }
  hit=$(awk -F, -v a="$l0" '/^\[0\] op,/ && $5 > a { printf "%.3f %.3f", $5 - a, $6; exit }' "$log")
  read -r hit_s hit_ms <<<"${hit:-x x}"
  during=$(awk -F, -v a="$l0" -v b="$l1" '/^\[0\] op,/ && $4 > a && $5 < b { n++ } END { print n + 0 }' "$log")
  echo "links moved to eth0's device: $moved (log lines); long cut: $(awk -v a="$l0" -v b="$l1" 'BEGIN { printf "%.1f", b - a }') s," \
    "the op in flight ended ${hit_s} s into it (${hit_ms} ms long), $during ops ran wholly inside it"
  [ "$moved" -gt 0 ] || { echo "FAIL: no verbs link moved to another device"; fail=1; }
  awk -v h="$hit_s" -v a="$l0" -v b="$l1" 'BEGIN { exit !(h != "x" && h + 0 < b - a) }' ||
    { echo "FAIL: the op in flight at the long cut did not end before eth1 came back"; fail=1; }
  [ "$during" -ge 3 ] || { echo "FAIL: only $during ops ran during the long cut"; fail=1; }
  # The blackhole: the links' writes wait while eth0's complete, so the
  # stall watch fails them after COHORT_RAIL_STALL_MS (100 ms), not the
  # QP's retries (the soft provider's 1 s: the op hit took 1.34-1.40 s so,
  # and 2.1 s with the first dial through eth1). The slowest op that ran in
  # its first second:
  read -r b0 b1 <"$out/blackhole" 2>/dev/null || { b0=0 b1=0; }
  bh=$(awk -F, -v a="$b0" '/^\[0\] op,/ && $5 > a && $4 < a + 1 { if ($6 > m) m = $6 } END { printf "%.1f", m }' "$log")
  echo "blackhole: the slowest op in its first second took $bh ms"
  if [ "${COHORT_TIMING_CHECKS:-1}" != 0 ] && ! awk -v m="$bh" 'BEGIN { exit !(m > 0 && m < 900) }'; then
    echo "FAIL: an op in the blackhole's first second took $bh ms (the stall watch did not move its links)"
    fail=1
  fi
fi
# A return after the last cut, and ops after that return.
lastcut=$(tail -1 "$out/cuts" 2>/dev/null || echo 0)
lastback=$(awk -v re="$BACK" '$0 ~ re { if ($2 > t) t = $2 } END { print t + 0 }' "$log")
after=$(awk -F, -v t="$lastback" '/^\[0\] op,/ && $4 > t { n++ } END { print n + 0 }' "$log")
awk -v a="$lastback" -v c="$lastcut" 'BEGIN { exit !(a > c) }' ||
  { echo "FAIL: no link came back after the last cut (at $lastcut; last return $lastback)"; fail=1; }
[ "$after" -ge 3 ] || { echo "FAIL: only $after ops ran after the last return"; fail=1; }
# For the log: the slowest ops (those hit by a cut) beside the median.
awk -F, '/^\[0\] op,/ { print $6 }' "$log" | sort -n |
  awk '{ a[NR] = $1 } END { if (NR) printf "ops: %d, median %.1f ms, slowest %.1f %.1f %.1f ms\n", NR, a[int((NR + 1) / 2)], a[NR], a[NR - 1], a[NR - 2] }'
echo "link ends failed over: $fo, back: $back; ops after the last return: $after; $(($(date +%s) - t0)) s"
if [ $fail = 0 ]; then echo "OK"; else
  echo "--- last lines of the stream log:"
  grep -v ' INFO .*lost rank' "$log" | tail -30
  keep=${TMPDIR:-/tmp}/cohort-rails-fail-$$.log
  cp "$log" "$keep" && echo "the whole log: $keep"
  exit 1
fi
