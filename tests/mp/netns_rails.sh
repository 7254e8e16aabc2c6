#!/bin/sh
# netns_rails.sh CMD ARGS...: run CMD in a network namespace of its own
# (unshare -n) with two interfaces, d0 (10.250.0.1) and d1 (10.250.1.1)
# (veth pairs: this kernel has no dummy interfaces), each a rail's interface
# (cohortrun --nics d0:verbs,d1:verbs), and 127.0.0.1 for the store. Unlike
# lo,lo the rails have addresses of their own, so nftables can take one away
# (tests/mp/blackout.sh) while the other and the store go on. The namespace,
# its interfaces and its rules go with the command; nothing outside it is
# touched. Skips (77) where namespaces, veth pairs or nftables are not to be
# had (not root); fails (1) when the interfaces made do not come up.
set -eu
command -v unshare >/dev/null 2>&1 || { echo "netns_rails.sh: no unshare: skipped"; exit 77; }
command -v nft >/dev/null 2>&1 || { echo "netns_rails.sh: no nft: skipped"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "netns_rails.sh: needs root (a namespace): skipped"; exit 77; }
unshare -n true 2>/dev/null || { echo "netns_rails.sh: unshare -n refused: skipped"; exit 77; }
exec unshare -n sh -c '
  ip link set lo up || exit 77
  nft list tables >/dev/null 2>&1 || { echo "netns_rails.sh: nftables refused: skipped"; exit 77; }
  for i in 0 1; do
    ip link add d$i type veth peer name d${i}p 2>/dev/null ||
      { echo "netns_rails.sh: no veth pairs: skipped"; exit 77; }
    ip addr add 10.250.$i.1/24 dev d$i && ip link set d${i}p up && ip link set d$i up ||
      { echo "netns_rails.sh: d$i: setup failed"; exit 1; }
  done
  # Up and running (the carrier comes a moment later): a verbs rail opens
  # only on an active port.
  for i in 0 1; do
    n=0
    until ip link show d$i | grep -q LOWER_UP; do
      n=$((n + 1)); [ $n -le 100 ] || { echo "netns_rails.sh: d$i never came up"; exit 1; }
      sleep 0.02
    done
  done
  exec "$@"' netns_rails "$@"
