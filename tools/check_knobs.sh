#!/usr/bin/env bash
# tools/check_knobs.sh COHORTRUN: the knob tables in README.md and
# docs/sched.md are exactly what the tables in the code say
# (`cohortrun --knobs config|sched`, generated from RX_CONFIG_MAP,
# RX_ENV_MAP and SC_PARAM_MAP). To update the docs after changing a table:
#   tools/check_knobs.sh build/bin/cohortrun --write
set -euo pipefail
cd "$(dirname "$0")/.."
run=$1
write=${2:-}
bad=0
check() { # file, which
  local file=$1 which=$2 begin="<!-- knobs:$2 -->" end="<!-- /knobs:$2 -->"
  grep -qF "$begin" "$file" || { echo "knobs: $file has no $begin block"; bad=1; return; }
  local want got
  want=$("$run" --knobs "$which")
  got=$(awk -v b="$begin" -v e="$end" '$0==e{p=0} p{print} $0==b{p=1}' "$file")
  if [ "$want" != "$got" ]; then
    if [ "$write" = --write ]; then
      awk -v b="$begin" -v e="$end" -v t="$want" '$0==e{print t; p=0} !p{print} $0==b{p=1}' \
        "$file" >"$file.tmp" && mv "$file.tmp" "$file"
      echo "knobs: rewrote the $which table in $file"
    else
      echo "knobs: the $which table in $file differs from the code's:"
      diff <(echo "$want") <(echo "$got") || true
      bad=1
    fi
  fi
}
check README.md config
check docs/sched.md sched
[ $bad -eq 0 ] || { echo "knobs: run tools/check_knobs.sh $run --write"; exit 1; }
echo "knobs: README.md and docs/sched.md match the code's tables"
