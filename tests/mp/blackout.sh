#!/bin/sh
# blackout.sh ADDR MS: from now on, for MS milliseconds, every TCP packet to
# or from ADDR is dropped (nftables, in the caller's network namespace:
# tests/mp/netns_rails.sh), as when the switch behind an interface dies:
# nothing is refused or reset, connections and dials just go unanswered.
# Returns at once; a child lifts the rule when the time is up. Each call has
# a table of its own, so blackouts may overlap.
set -eu
addr=${1:?usage: blackout.sh ADDR MS} ms=${2:?usage: blackout.sh ADDR MS}
t=cohort_blackout_$$
nft -f - <<NFT
table ip $t {
  chain out { type filter hook output priority 0; ip daddr $addr meta l4proto tcp drop; ip saddr $addr meta l4proto tcp drop; }
}
NFT
secs=$(awk "BEGIN { print $ms / 1000 }")
(sleep "$secs"; nft delete table ip "$t") >/dev/null 2>&1 </dev/null &
