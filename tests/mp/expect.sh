#!/usr/bin/env bash
# expect.sh CODE PATTERN COUNT -- command...
# Runs the command; passes when it exits with CODE and its output has at
# least COUNT lines matching PATTERN (grep -E). Prints the output either way.
set -u
want_code=$1 pattern=$2 want_count=$3
shift 3
[ "$1" = "--" ] && shift
out=$("$@" 2>&1)
code=$?
printf '%s\n' "$out"
count=$(printf '%s\n' "$out" | grep -cE "$pattern")
if [ "$code" != "$want_code" ]; then
  echo "expect.sh: exit code $code, expected $want_code" >&2
  exit 1
fi
if [ "$count" -lt "$want_count" ]; then
  echo "expect.sh: $count lines match '$pattern', expected at least $want_count" >&2
  exit 1
fi
exit 0
