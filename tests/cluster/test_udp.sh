#!/usr/bin/env bash
# cluster.udp: bounded-loss allreduces across namespaces (docs/udp.md), 4
# ranks behind 400 Mbit/s links whose arriving UDP datagrams nftables drops
# at random (numgen) at 0.5%, 1% and 5%: every op completes, each rank's lost
# fraction stays within its bounds, the values that arrived are exact and
# the short ones account exactly for the lost bytes (test_udp lossy; at 5%
# drops under a 1% bound every op asks for segments again). Last, 5% of
# every packet, TCP too: the control messages' datagram copies and their
# TCP copies must agree (idempotent by pass). At 1% a counter
# on the hub's bridges sees the datagrams leave with DSCP class selectors
# CS1..CS5 (layers 1..5 of 8) and both ECN-capable and not. Then spraying:
# two udp rails of 400 and 100 Mbit/s (NIC:udp@MBPS), 1% drops: every op's
# datagrams go over both, and the slow rail carries a share near its rate's
# (5% to 35% of what each rank sent; equal turns would be 50%). Last, two
# equal rails without drops: what a rank reports lost must stay under 0.2% of
# the push (the rail with the TCP links queues longer, and a receive that
# decided one period after DONE counted that rail's last datagrams, still on
# their way, as lost: 0.5%). About 60 s.
#   test_udp.sh TEST_UDP
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: test_udp.sh path/to/test_udp}
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 77; }
out=$(mktemp -d /tmp/cohort-ud.XXXXXX)
trap 'rm -rf "$out"' EXIT
cat > "$out/run.sh" <<EOS
#!/usr/bin/env bash
# run.sh PUSH PULL TAGS(0|1) NICS [MAX_LOST_PUSH_PCT]
set -uo pipefail
hub="\$COHORT_CLUSTER-hub"
if [ "\$3" = 1 ]; then
  ip netns exec "\$hub" nft -f - <<'EON' || exit 1
table bridge cohort_tags {
  chain tags {
    type filter hook forward priority 0; policy accept;
    meta l4proto udp ip dscp cs1 counter
    meta l4proto udp ip dscp cs2 counter
    meta l4proto udp ip dscp cs3 counter
    meta l4proto udp ip dscp cs4 counter
    meta l4proto udp ip dscp cs5 counter
    meta l4proto udp ip ecn ect0 counter
    meta l4proto udp ip ecn not-ect counter
  }
}
EON
fi
"$here/cluster.sh" run "\$COHORT_CLUSTER" --nics "\$4" --timeout 120 -- \\
  "$prog" lossy 6 "\$1" "\$2" > "$out/run.log" 2>&1
rc=\$?
n=\$(grep -cE "rank [0-9]+: OK lossy" "$out/run.log")
if [ \$rc != 0 ] || [ "\$n" != 4 ]; then
  tail -30 "$out/run.log"; echo "FAIL: exit \$rc, \$n ranks OK"; exit 1
fi
grep -E "OK lossy|by rail" "$out/run.log"
if [ -n "\${5:-}" ]; then
  grep -E "OK lossy" "$out/run.log" | sed 's/.*lost \([0-9.]*\)% of the push.*/\1/' |
    awk -v m="\$5" '\$1 > m { bad = 1 } END { exit bad }' ||
    { echo "FAIL: a rank lost more than \$5% of the push without drops"; exit 1; }
fi
if [[ "\$4" == *,*@100 ]]; then
  # Each rank's datagrams by rail (sent/received): the slow rail's share.
  grep -E "datagrams by rail" "$out/run.log" | sed 's/.*rail: //; s|/[0-9]*||g' |
    awk '{ s = \$1 + \$2; f = \$2 / s; printf "slow rail: %.1f%% of %d datagrams\\n", 100 * f, s;
           if (f < 0.05 || f > 0.35) bad = 1 } END { exit bad }' ||
    { echo "FAIL: the slow rail's share is off its rate's"; exit 1; }
fi
for ns in \$(ip netns list | awk '{print \$1}' | grep "^\$COHORT_CLUSTER-[0-9]"); do
  echo "\$ns: \$(ip netns exec "\$ns" nft list table inet cohort_loss | grep -o 'packets [0-9]*') dropped"
done
if [ "\$3" = 1 ]; then
  counts=\$(ip netns exec "\$hub" nft list table bridge cohort_tags | grep -o 'packets [0-9]*' |
    awk '{print \$2}' | tr '\n' ' ')
  echo "hub udp datagrams by DSCP CS1..CS5, ECT(0), not-ECT: \$counts"
  for c in \$counts; do
    [ "\$c" -gt 0 ] || { echo "FAIL: a mark never left the hosts (\$counts)"; exit 1; }
  done
fi
EOS
chmod +x "$out/run.sh"
for spec in "0.5 0.05 0.02 0 udp" "1 0.05 0.02 1 udp" "5 0.01 0.005 0 udp" "5 0.02 0.01 0 all" \
  "1 0.05 0.02 0 udp 2" "0 0.05 0.02 0 udp 2=" ; do
  read -r loss push pull tags proto nics <<<"$spec"
  nics=${nics:-1} maxlost=""
  rates=400 names=eth0:udp
  [ "$nics" = 2 ] && rates=400:100 names=eth0:udp@400,eth1:udp@100
  [ "$nics" = 2= ] && nics=2 rates=400:400 names=eth0:udp@400,eth1:udp@400 maxlost=0.2
  echo "== ${loss}% drops ($proto), bounds push $push pull $pull, --nics $names"
  set +e
  "$here/cluster.sh" with ud+ 4 --nics "$nics" --rates "$rates" --loss "$loss" --loss-proto "$proto" -- \
    "$out/run.sh" "$push" "$pull" "$tags" "$names" $maxlost
  rc=$?
  set -e
  [ $rc = 77 ] && exit 77
  [ $rc = 0 ] || { echo "test_udp: failed at ${loss}% drops ($rc)"; exit 1; }
done
echo "OK"
