#!/bin/sh
# netns6.sh CMD ARGS...: run CMD in a network namespace of its own (unshare -n)
# whose loopback carries two IPv6 addresses, fd00:c0::1 and fd00:c0::2 (each a
# rail's "interface": cohortrun --nics fd00:c0::1,fd00:c0::2), and 127.0.0.1
# for the store. The namespace goes with the command; nothing outside it is
# touched. Skips (77) where namespaces cannot be made (not root, no unshare)
# or IPv6 is off.
set -eu
command -v unshare >/dev/null 2>&1 || { echo "netns6.sh: no unshare: skipped"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "netns6.sh: needs root (a namespace): skipped"; exit 77; }
unshare -n true 2>/dev/null || { echo "netns6.sh: unshare -n refused: skipped"; exit 77; }
exec unshare -n sh -c '
  ip link set lo up || exit 77
  echo 0 >/proc/sys/net/ipv6/conf/lo/disable_ipv6 2>/dev/null
  ip -6 addr add fd00:c0::1/128 dev lo nodad 2>/dev/null &&
    ip -6 addr add fd00:c0::2/128 dev lo nodad 2>/dev/null ||
    { echo "netns6.sh: no IPv6 here: skipped"; exit 77; }
  exec "$@"' netns6 "$@"
