#!/usr/bin/env bash
# The Ray cluster tests (crates/python/tests/test_cluster.py), inside a network namespace made
# for them: Ray registers its node on the machine's own address and probes an outside one to
# find it, so no Ray process may start where it can reach beyond loopback. Needs root (or
# user namespaces) for `unshare -n`. Usage: scripts/cluster_test.sh PYTHON [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:?usage: scripts/cluster_test.sh PYTHON [pytest args...]}
shift
exec unshare -n bash -c '
  set -euo pipefail
  ip link set lo up
  export CRATERDEX_NETNS=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
  python=$1; shift
  "$python" -m pytest -q -p no:cacheprovider crates/python/tests/test_cluster.py "$@"
' cluster-test "$python" "$@"
