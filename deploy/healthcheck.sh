#!/bin/bash
# strata-healthcheck: container health checks that need nothing beyond bash and `strata`
# (no grpc_health_probe, no jq, no downloads). Installed in the image as
# /usr/local/bin/strata-healthcheck.
#
#   strata-healthcheck tcp HOST:PORT
#       Passes when something accepts a TCP connection on HOST:PORT (bash's /dev/tcp). For the
#       router this means "listening" (it listens before the workers register); for the cache it
#       means "ready" (the cache loads every expert before it listens).
#   strata-healthcheck ready ADDRESS [WORKERS]
#       Passes when the router answers Admin.Stats (`strata stats`) and every worker it waits for
#       is connected, i.e. registered: the state in which it prints READY and its grpc.health.v1
#       says SERVING. With WORKERS, also at least that many workers must be connected (a guard
#       against a router started with a smaller --workers than the deployment runs). Sends no
#       request through the model, so a short interval is fine.
#       Admin is served only on the router's INTERNAL listener (--internal-listen), never on the
#       client port, and refuses calls without the cluster token. So:
#       - with $STRATA_CLUSTER_TOKEN set (the compose files give it to every strata container),
#         or with a unix:PATH ADDRESS, ADDRESS is the router's internal listener (127.0.0.1:50053
#         in deploy/docker-compose*.yml) and the check runs `strata stats --admin ADDRESS`,
#         which sends the token of $STRATA_CLUSTER_TOKEN;
#       - otherwise ADDRESS is the CLIENT port of a cluster that `strata up` started as this
#         user in this container (the image's default command and HEALTHCHECK, `ready
#         127.0.0.1:50051`): `strata stats --server ADDRESS` finds its internal listener and
#         token in the user's runtime directory. That lookup does not work across containers.
#   strata-healthcheck generate HOST:PORT
#       Passes when a 1-token Generate through the router's client port succeeds, i.e. the
#       whole path (router, channels, workers, GPUs) computes. It runs a real forward step, so
#       keep its interval long; token id 0 is a valid prompt for any model. Needs no token.
#   strata-healthcheck mps
#       Passes when a CUDA MPS control daemon answers on $CUDA_MPS_PIPE_DIRECTORY
#       (`get_server_list` through nvidia-cuda-mps-control).
#
# STRATA_HEALTHCHECK_TIMEOUT (seconds; default 5 for tcp and mps, 12 for ready, 30 for generate)
# bounds each check.
set -uo pipefail

usage() {
  echo "usage: strata-healthcheck tcp|generate HOST:PORT | ready ADDRESS [WORKERS] | mps" >&2
  exit 2
}
[ $# -ge 1 ] || usage
mode=$1
shift

if [ "$mode" = mps ]; then
  [ $# -eq 0 ] || usage
  command -v nvidia-cuda-mps-control >/dev/null 2>&1 ||
    { echo "strata-healthcheck: nvidia-cuda-mps-control is not on PATH (a container without GPUs?)" >&2; exit 1; }
  echo get_server_list | timeout "${STRATA_HEALTHCHECK_TIMEOUT:-5}" nvidia-cuda-mps-control \
    >/dev/null 2>&1 ||
    { echo "strata-healthcheck: no MPS control daemon on ${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}" >&2; exit 1; }
  exit 0
fi

[ $# -ge 1 ] && [ $# -le 2 ] || usage
address=$1
expected=${2:-}
[ -z "$expected" ] || [ "$mode" = ready ] || usage
[[ -z "$expected" || "$expected" =~ ^[0-9]+$ ]] || usage
if [ "$mode" = ready ] && [[ $address == unix:?* ]]; then
  host="" port=""  # a Unix socket: only `strata stats --admin` can use it
else
  [[ $address != unix:* ]] || usage
  host=${address%:*}
  port=${address##*:}
  [ -n "$host" ] && [ -n "$port" ] && [ "$host" != "$address" ] || usage
fi
strata=$(command -v strata || echo "$(dirname "$0")/strata")

case $mode in
  tcp)
    timeout "${STRATA_HEALTHCHECK_TIMEOUT:-5}" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" \
      2>/dev/null || { echo "strata-healthcheck: nothing accepts connections on $address" >&2; exit 1; }
    ;;
  ready)
    # Admin is on the router's internal listener and needs the cluster token: with
    # $STRATA_CLUSTER_TOKEN (or a unix: ADDRESS), ADDRESS is that listener and `strata stats`
    # sends the token from the environment; without it, ADDRESS is the client port of this
    # user's `strata up` cluster, which `strata stats --server` resolves through the local
    # runtime directory.
    if [ -n "${STRATA_CLUSTER_TOKEN:-}" ] || [ -z "$port" ]; then
      target=(--admin "$address")
    else
      target=(--server "$address")
    fi
    # `strata stats` prints the StatsResponse as JSON with every field, one entry per worker the
    # router waits for: {"index":0,"connected":true,...}.
    if ! stats=$(timeout "${STRATA_HEALTHCHECK_TIMEOUT:-12}" "$strata" stats "${target[@]}" 2>&1); then
      echo "strata-healthcheck: $address does not answer Admin.Stats: $stats" >&2
      exit 1
    fi
    connected=$(grep -o '"connected": *true' <<<"$stats" | wc -l)
    missing=$(grep -o '"connected": *false' <<<"$stats" | wc -l)
    if [ "$missing" -gt 0 ]; then
      echo "strata-healthcheck: $missing of $((connected + missing)) worker(s) not registered" >&2
      exit 1
    fi
    if [ -n "$expected" ] && [ "$connected" -lt "$expected" ]; then
      echo "strata-healthcheck: the router has $connected worker(s) connected, $expected expected" >&2
      exit 1
    fi
    ;;
  generate)
    timeout "${STRATA_HEALTHCHECK_TIMEOUT:-30}" "$strata" generate --server "$address" --ids 0 \
      --max-new-tokens 1 --ignore-eos >/dev/null || exit 1
    ;;
  *)
    usage
    ;;
esac
exit 0
