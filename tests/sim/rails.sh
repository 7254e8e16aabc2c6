#!/usr/bin/env bash
# rails.sh COHORT_SIM: the multi-rail balancer through `cohort-sim rails`
# (sched/sc_lb.h on modelled rails, 4-rank ring allreduces of 16 MiB):
#   equal rails: >= 1.85x one rail; rails at 1:3: >= 0.9 of the sum of both;
#   a rail cut at op 100 and back at op 150: no op lost, the rail is used again;
#   a saved table loaded by a second run: its first ops are already balanced.
set -euo pipefail
sim=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ratio() { sed -n 's/.*(\([0-9.]*\)x).*/\1/p' <<<"$1" | head -1; }

out=$("$sim" rails --rail 50:400 --rail 50:400 --ops 200)
echo "$out" | head -2
r=$(ratio "$out")
awk -v r="$r" 'BEGIN { exit !(r >= 1.85) }' || fail "2 equal rails: ${r}x one rail, want >= 1.85"

# 1:3: the ideal is the sum of both rates, 4/3 of the fast rail alone.
out=$("$sim" rails --rail 50:100 --rail 50:300 --ops 200)
echo "$out" | head -2
r=$(ratio "$out")
awk -v r="$r" 'BEGIN { exit !(r / (4.0 / 3.0) >= 0.9) }' || fail "1:3 rails: ${r}x the fast rail, want >= 0.9 x 4/3"

out=$("$sim" rails --rail 50:400 --rail 50:400 --ops 200 --cut 1@100 --back 1@150 --csv)
echo "$out" | tail -2
grep -q "no rail is up" <<<"$out" && fail "an op failed with a rail still up"
grep -q "^# failovers 1," <<<"$out" || fail "the cut was not a failover"
awk -F, '$1 >= 101 && $1 <= 149 && $6 > 0 { bad = 1 } END { exit bad }' <<<"$out" ||
  fail "the cut rail carried data while down"
awk -F, '$1 >= 160 && $1 <= 200 && $6 > 0.4 { n++ } END { exit !(n >= 30) }' <<<"$out" ||
  fail "the rail did not come back into use"

"$sim" rails --rail 50:100 --rail 50:300 --ops 50 --table-out "$dir/table" >/dev/null
out=$("$sim" rails --rail 50:100 --rail 50:300 --ops 3 --table-in "$dir/table" --csv)
awk -F, '$1 == 2 { exit !($5 > 0.2 && $5 < 0.3) }' <<<"$out" ||
  fail "loaded table: op 2 not at the 1:3 share: $out"
echo "rails: OK"
