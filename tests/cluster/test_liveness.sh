#!/usr/bin/env bash
# cluster.liveness: a control connection held back by TCP's retransmission
# backoff is not a hung rank. 3 ranks; after a first allreduce every rank
# idles 10 s (test_hardening ctl-quiet). Meanwhile nftables drops every TCP
# packet between rank 1 and rank 0 (the coordinator), both ways, for 5 s:
# longer than COHORT_LIVENESS_MS (3 s), as a segment lost four times in a
# row on a lossy link is. The heartbeat datagrams (rx_ctl.h BEAT) still
# pass, so neither side may take the other for hung: the last allreduce must
# succeed on every rank. Without them the coordinator excluded rank 1 ("rank
# 1 is unresponsive") and rank 1 dropped the coordinator. Then the same with
# UDP dropped too: the silence must still be found (the last allreduce
# fails with EPEER), or liveness would mean nothing. About 40 s.
#   test_liveness.sh TEST_HARDENING
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: test_liveness.sh path/to/test_hardening}
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 77; }
command -v nft > /dev/null || { echo "no nft"; exit 77; }
out=$(mktemp -d /tmp/cohort-lv.XXXXXX)
trap 'rm -rf "$out"' EXIT
cat > "$out/run.sh" <<EOS
#!/usr/bin/env bash
# run.sh PROTO(tcp|all) EXPECT(ok|lost)
set -uo pipefail
ns0="\$COHORT_CLUSTER-0" ns1="\$COHORT_CLUSTER-1"
a0=\$(ip netns exec "\$ns0" ip -4 -o addr show eth0 | awk '{print \$4}' | cut -d/ -f1)
a1=\$(ip netns exec "\$ns1" ip -4 -o addr show eth0 | awk '{print \$4}' | cut -d/ -f1)
match="meta l4proto tcp "
[ "\$1" = all ] && match=""
rm -f "$out/mark"
"$here/cluster.sh" run "\$COHORT_CLUSTER" --timeout 90 -- "$prog" ctl-quiet 10 "$out/mark" \\
  > "$out/run.log" 2>&1 &
pid=\$!
for _ in \$(seq 300); do [ -e "$out/mark" ] && break; kill -0 \$pid 2> /dev/null || break; sleep 0.1; done
[ -e "$out/mark" ] || { wait \$pid; tail -20 "$out/run.log"; echo "FAIL: rank 1 never idled"; exit 1; }
for pair in "\$ns0 \$a1" "\$ns1 \$a0"; do
  read -r ns from <<<"\$pair"
  ip netns exec "\$ns" nft -f - <<EON || { kill \$pid; wait \$pid; echo "FAIL: nft"; exit 1; }
table inet cohort_quiet {
  chain input {
    type filter hook input priority 0; policy accept;
    ip saddr \$from \${match}counter drop
  }
}
EON
done
sleep 5
for ns in "\$ns0" "\$ns1"; do
  echo "\$ns: \$(ip netns exec "\$ns" nft list table inet cohort_quiet | grep -o 'packets [0-9]*') dropped"
  ip netns exec "\$ns" nft delete table inet cohort_quiet
done
wait \$pid
rc=\$?
n=\$(grep -c "OK ctl-quiet" "$out/run.log")
if [ "\$2" = ok ]; then
  if [ \$rc != 0 ] || [ "\$n" != 3 ]; then
    tail -30 "$out/run.log"; echo "FAIL: exit \$rc, \$n ranks OK"; exit 1
  fi
  grep "OK ctl-quiet" "$out/run.log"
else
  grep -E "FAIL rank" "$out/run.log" | head -3
  if [ \$rc = 0 ] || ! grep -q "EPEER" "$out/run.log"; then
    tail -30 "$out/run.log"; echo "FAIL: 5 s of silence went unnoticed (exit \$rc)"; exit 1
  fi
fi
EOS
chmod +x "$out/run.sh"
for spec in "tcp ok" "all lost"; do
  read -r proto expect <<<"$spec"
  echo "== every $proto packet between rank 1 and the coordinator dropped for 5 s: expect $expect"
  set +e
  "$here/cluster.sh" with lv+ 3 --rates 400 -- "$out/run.sh" "$proto" "$expect"
  rc=$?
  set -e
  [ $rc = 77 ] && exit 77
  [ $rc = 0 ] || { echo "test_liveness: failed ($proto)"; exit 1; }
done
echo "OK"
