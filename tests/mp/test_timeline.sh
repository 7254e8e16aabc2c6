#!/usr/bin/env bash
# mp.timeline.n3: COHORT_TIMELINE on a short cohort-load run (3 ranks, every
# collective and sync mode, a straggler): each rank's Chrome trace must be
# valid JSON, in time order, its async requests and slices matched and
# nested, its complete events nested per thread, and hold every request the
# library counted; the merge tool must put them on one clock; and the trace
# must show syncs, the coordinator's launches with their reason and waits.
#   test_timeline.sh COHORTRUN COHORT_LOAD MERGE_TOOL PYTHON
set -euo pipefail
run=$1 load=$2 merge=$3 py=$4
dir=$(mktemp -d /tmp/cohort-timeline.XXXXXX)
trap 'rm -rf "$dir"' EXIT
COHORT_TIMELINE="$dir/tl.%d.json" "$run" -n 3 --timeout 120 -- "$load" --duration 3 \
  --sync-modes allreduce,partial,selective,relay --straggler 2:5 --sizes 0:256K | grep SUMMARY
"$py" "$merge" --check "$dir/merged.json" "$dir"/tl.0.json "$dir"/tl.1.json "$dir"/tl.2.json
fail=0
for what in '"cat":"sync","name":"wait for a group"' '"cat":"sync","name":"exchange"' \
  '"cat":"wait","name":"coh_wait"' '"name":"allreduce"' '"name":"slice"'; do
  for r in 0 1 2; do
    grep -q "$what" "$dir/tl.$r.json" || { echo "FAIL: rank $r's trace has no $what"; fail=1; }
  done
done
grep -q '"cat":"coordinator","name":"launch".*"why":"' "$dir/tl.0.json" ||
  { echo "FAIL: the coordinator's launches (rank 0) are not in its trace"; fail=1; }
[ $fail = 0 ] && echo "PASS: 3 timelines valid, merged, with requests, syncs, waits and launches"
exit $fail
