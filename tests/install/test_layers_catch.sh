#!/usr/bin/env bash
# test_layers_catch.sh SRC WORK: tools/check_layers.sh on a made-up tree must
# pass when every include points down and fail on an upward include and on a
# library a layer may not see.
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work/tools" "$work/sched" "$work/engines"
cp "$src/tools/check_layers.sh" "$src/tools/layers.txt" "$work/tools/"
printf '#include "base/base.h"\n#include "sched/sc_plan.h"\n' >"$work/sched/ok.c"
printf '#include <uv.h>\n#include "sched/sc_plan.h"\n' >"$work/engines/ok.c"
"$work/tools/check_layers.sh" >/dev/null || { echo "a clean tree was refused"; exit 1; }
printf '#include "reactor/reactor.h"\n' >"$work/sched/up.c"
printf '#include <uv.h>\n' >"$work/sched/uv.c"
if out=$("$work/tools/check_layers.sh"); then
  echo "an upward include passed: $out"
  exit 1
fi
grep -q "sched/up.c includes a header of reactor/" <<<"$out" || { echo "missed up.c: $out"; exit 1; }
grep -q "sched/uv.c includes <uv.h>" <<<"$out" || { echo "missed uv.c: $out"; exit 1; }
echo "layers check catches both: OK"
