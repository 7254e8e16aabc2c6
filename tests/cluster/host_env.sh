#!/bin/sh
# host_env.sh RANK CMD ARGS... - run a rank of the namespace cluster as a host
# of its own: the ranks share one kernel (and so one boot id), so without
# this they would find each other on the same host and talk through shared
# memory instead of the links under test. COHORT_CLUSTER_HOSTS ("a a b b":
# one word per rank) puts ranks on the same pretend host instead.
rank=$1
shift
if [ -n "${COHORT_CLUSTER_HOSTS:-}" ]; then
  # shellcheck disable=SC2086
  set -- "$(echo $COHORT_CLUSTER_HOSTS | cut -d' ' -f$((rank + 1)))" "$@"
else
  set -- "${COHORT_CLUSTER:-cluster}-host-$rank" "$@"
fi
COHORT_HOST_ID=$1
export COHORT_HOST_ID
shift
exec "$@"
