#!/usr/bin/env bash
# cluster.relay: relay groups and their failures across namespaces, every
# rank behind a shaped link (300 Mbit/s; rank 3, the straggler, at 100):
# weighted relay syncs and relay allreduces with exact results (the
# straggler relays phase 1, phase 2 folds its data in); the straggler
# SIGKILLed mid-run (the others go on, told once, no wrong value); and the
# coordinator SIGSTOPped (found silent after COHORT_LIVENESS_MS, the
# survivors elect rank 1 over the bridge and go on). About 40 s.
#   test_relay.sh TEST_RELAY
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: test_relay.sh path/to/test_relay}
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 77; }
out=$(mktemp -d /tmp/cohort-rl.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/kill" "$out/stop"
cat > "$out/run.sh" <<EOS
#!/usr/bin/env bash
set -uo pipefail
c() { "$here/cluster.sh" run "\$COHORT_CLUSTER" "\$@"; }
expect() { # code pattern count log -- cmd...
  local code=\$1 pat=\$2 cnt=\$3 log=\$4; shift 5
  "\$@" > "\$log" 2>&1; local rc=\$?
  local n; n=\$(grep -cE "\$pat" "\$log")
  if [ "\$rc" != "\$code" ] || [ "\$n" -lt "\$cnt" ]; then
    tail -30 "\$log"; echo "FAIL: \$log: exit \$rc (want \$code), \$n lines like '\$pat' (want \$cnt)"; exit 1
  fi
  grep -E "\$pat" "\$log" | head -4
}
expect 0 "rank [0-9]+: OK" 4 "$out/sync.log" -- c --timeout 120 -- "$prog" sync 20
expect 0 "rank [0-9]+: OK" 4 "$out/allreduce.log" -- c --timeout 120 -- "$prog" allreduce 20
export COHORT_LIVENESS_MS=1000 COHORT_TIMEOUT_MS=4000
expect 137 "rank [0-9]+: OK fault" 3 "$out/kill.log" -- c --keep-going --timeout 120 -- \\
  "$prog" fault kill "$out/kill" 3
expect 137 "rank [0-9]+: OK fault" 3 "$out/stop.log" -- c --keep-going --timeout 120 -- \\
  "$prog" fault stop "$out/stop" 0
EOS
chmod +x "$out/run.sh"
set +e
"$here/cluster.sh" with rl+ 4 --rates 300,300,300,100 -- "$out/run.sh"
rc=$?
set -e
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || { echo "test_relay: failed ($rc)"; exit 1; }
echo "OK"
