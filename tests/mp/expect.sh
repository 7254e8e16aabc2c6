#!/usr/bin/env bash
# expect.sh CODE PATTERN COUNT [PATTERN COUNT]... -- command...
# Runs the command; passes when it exits with CODE and, for each pair, its
# output has COUNT lines matching PATTERN (grep -E): COUNT is N (at least
# N) or N..M (from N to M). Prints the output either way.
set -u
want_code=$1
shift
pats=() counts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  pats+=("$1") counts+=("$2")
  shift 2
done
[ $# -gt 0 ] && shift
out=$("$@" 2>&1)
code=$?
printf '%s\n' "$out"
if [ "$code" != "$want_code" ]; then
  echo "expect.sh: exit code $code, expected $want_code" >&2
  exit 1
fi
for i in "${!pats[@]}"; do
  pattern=${pats[$i]} want=${counts[$i]}
  lo=${want%%..*} hi=
  [ "$lo" != "$want" ] && hi=${want##*..}
  count=$(printf '%s\n' "$out" | grep -cE "$pattern")
  if [ "$count" -lt "$lo" ] || { [ -n "$hi" ] && [ "$count" -gt "$hi" ]; }; then
    echo "expect.sh: $count lines match '$pattern', expected $want" >&2
    exit 1
  fi
done
exit 0
