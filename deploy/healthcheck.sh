#!/bin/bash
# strata-healthcheck: container health checks that need nothing beyond bash and `strata`
# (no grpc_health_probe, no downloads). Installed in the image as /usr/local/bin/strata-healthcheck.
#
#   strata-healthcheck tcp HOST:PORT
#       Passes when something accepts a TCP connection on HOST:PORT (bash's /dev/tcp). For the
#       router this means "listening" (it listens before the workers register); for the cache it
#       means "ready" (the cache loads every expert before it listens).
#   strata-healthcheck generate HOST:PORT
#       Passes when a 1-token Generate through the router succeeds, i.e. every worker has
#       registered and the whole path (router, shared-memory channels, workers) works. It runs a
#       real forward step, so keep its interval long; token id 0 is a valid prompt for any model.
#
# STRATA_HEALTHCHECK_TIMEOUT (seconds, default 5 for tcp, 30 for generate) bounds each check.
set -uo pipefail

usage() {
  echo "usage: strata-healthcheck tcp|generate HOST:PORT" >&2
  exit 2
}
[ $# -eq 2 ] || usage
mode=$1
address=$2
host=${address%:*}
port=${address##*:}
[ -n "$host" ] && [ -n "$port" ] && [ "$host" != "$address" ] || usage

case $mode in
  tcp)
    timeout "${STRATA_HEALTHCHECK_TIMEOUT:-5}" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" \
      2>/dev/null || { echo "strata-healthcheck: nothing accepts connections on $address" >&2; exit 1; }
    ;;
  generate)
    strata=$(command -v strata || echo "$(dirname "$0")/strata")
    timeout "${STRATA_HEALTHCHECK_TIMEOUT:-30}" "$strata" generate --server "$address" --ids 0 \
      --max-new-tokens 1 --ignore-eos >/dev/null || exit 1
    ;;
  *)
    usage
    ;;
esac
exit 0
