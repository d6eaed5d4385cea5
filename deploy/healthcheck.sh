#!/bin/bash
# strata-healthcheck: container health checks that need nothing beyond bash and `strata`
# (no grpc_health_probe, no jq, no downloads). Installed in the image as
# /usr/local/bin/strata-healthcheck.
#
#   strata-healthcheck tcp HOST:PORT
#       Passes when something accepts a TCP connection on HOST:PORT (bash's /dev/tcp). For the
#       router this means "listening" (it listens before the workers register); for the expert
#       store it means "ready" (the store loads every expert before it listens).
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
#   strata-healthcheck grpc HOST:PORT [SERVICE]
#       Passes when the standard gRPC health RPC (grpc.health.v1.Health/Check) on HOST:PORT
#       answers SERVING for SERVICE (default "": the whole server). On the router's client port
#       that is the state the router reports itself: SERVING once every worker has registered,
#       NOT_SERVING while one is missing; on strata-expert-store's port, SERVING once it listens (it
#       loads every expert first). Needs no token, sends no request through the model. bash
#       speaks the HTTP/2 (h2c, prior knowledge) and protobuf bytes of this one call itself over
#       /dev/tcp, so the image needs no grpc_health_probe; it prints the status it got when it
#       is not SERVING.
#   strata-healthcheck generate HOST:PORT
#       Passes when a 1-token Generate through the router's client port succeeds, i.e. the
#       whole path (router, channels, workers, GPUs) computes. It runs a real forward step, so
#       keep its interval long; token id 0 is a valid prompt for any model. Needs no token.
#   strata-healthcheck mps
#       Passes when a CUDA MPS control daemon answers on $CUDA_MPS_PIPE_DIRECTORY
#       (`get_server_list` through nvidia-cuda-mps-control).
#
# STRATA_HEALTHCHECK_TIMEOUT (seconds; default 5 for tcp, grpc and mps, 12 for ready, 30 for
# generate)
# bounds each check.
set -uo pipefail

usage() {
  echo "usage: strata-healthcheck tcp|generate HOST:PORT | grpc HOST:PORT [SERVICE] |" \
    "ready ADDRESS [WORKERS] | mps" >&2
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
expected="" service=""
case $mode in
  ready) expected=${2:-}; [[ -z "$expected" || "$expected" =~ ^[0-9]+$ ]] || usage ;;
  grpc) service=${2:-}; [ ${#service} -lt 128 ] || usage ;;
  *) [ $# -eq 1 ] || usage ;;
esac
if [ "$mode" = ready ] && [[ $address == unix:?* ]]; then
  host="" port=""  # a Unix socket: only `strata stats --admin` can use it
else
  [[ $address != unix:* ]] || usage
  host=${address%:*}
  port=${address##*:}
  [ -n "$host" ] && [ -n "$port" ] && [ "$host" != "$address" ] || usage
fi
strata=$(command -v strata || echo "$(dirname "$0")/strata")

# One grpc.health.v1.Health/Check call over HTTP/2 without TLS (h2c with prior knowledge, which
# is what a gRPC server accepts on a plaintext port), on file descriptor 3. Prints the
# HealthCheckResponse status (0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN) or a
# reason, and returns 0 only for SERVING. Bytes go out through printf's \xHH escapes and come
# back through head -c + od, so NUL bytes never pass through a shell variable.
grpc_health_check() {
  local host=$1 port=$2 service=$3
  { exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || { echo "cannot connect"; return 1; }
  hex() { printf '%s' "$1" | od -An -tx1 -v | tr -d ' \n'; }
  send() { printf "$(sed 's/../\\x&/g' <<<"$1")" >&3; }
  # A frame: 24-bit length, type, flags, 31-bit stream id, payload (all hex).
  frame() { printf '%06x%s%s%08x%s' $((${#4} / 2)) "$1" "$2" "$3" "$4"; }
  # HPACK "literal header field without indexing, new name", no Huffman (names and values
  # here are shorter than 127 bytes).
  header() { printf '00%02x%s%02x%s' ${#1} "$(hex "$1")" ${#2} "$(hex "$2")"; }
  local headers message
  headers=$(header :method POST)$(header :scheme http)
  headers+=$(header :path /grpc.health.v1.Health/Check)$(header :authority "$host:$port")
  headers+=$(header content-type application/grpc)$(header te trailers)
  # HealthCheckRequest {string service = 1}, behind gRPC's 5-byte prefix (uncompressed, length).
  message=""
  [ -z "$service" ] || message=$(printf '0a%02x%s' ${#service} "$(hex "$service")")
  message=$(printf '00%08x%s' $((${#message} / 2)) "$message")
  # Preface, an empty SETTINGS, HEADERS (END_HEADERS) and DATA (END_STREAM) on stream 1.
  send "$(hex $'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n')$(frame 04 00 0 "")$(frame 01 04 1 "$headers")$(frame 00 01 1 "$message")"
  local fh length type flags stream payload data=""
  while :; do
    fh=$(head -c 9 <&3 | od -An -tx1 -v | tr -d ' \n')
    [ ${#fh} -eq 18 ] || { echo "the connection closed before the answer"; return 1; }
    length=$((16#${fh:0:6})) type=${fh:6:2} flags=$((16#${fh:8:2}))
    stream=$((16#${fh:10:8} & 0x7fffffff))
    payload=""
    [ "$length" -eq 0 ] || payload=$(head -c "$length" <&3 | od -An -tx1 -v | tr -d ' \n')
    [ ${#payload} -eq $((length * 2)) ] || { echo "the connection closed mid-frame"; return 1; }
    case $type in
      04) ((flags & 1)) || send "$(frame 04 01 0 "")" ;;  # SETTINGS: acknowledge
      06) ((flags & 1)) || send "$(frame 06 01 0 "$payload")" ;;  # PING: answer
      07) echo "the server sent GOAWAY"; return 1 ;;
      03) [ "$stream" -ne 1 ] || { echo "the server reset the call"; return 1; } ;;
      00) [ "$stream" -ne 1 ] || data+=$payload ;;
    esac
    # The call ends with END_STREAM on stream 1 (trailers, or a trailers-only error answer).
    if [ "$stream" -eq 1 ] && [[ $type == 0[01] ]] && ((flags & 1)); then break; fi
  done
  exec 3>&-
  # One gRPC message: flag byte, 4-byte length, HealthCheckResponse {ServingStatus status = 1}
  # (absent when 0, UNKNOWN).
  if [ ${#data} -lt 10 ]; then
    echo "no answer (a server without the health service, or an unknown service name)"
    return 1
  fi
  local status=0
  [ "${data:10:2}" != 08 ] || status=$((16#${data:12:2}))
  case $status in
    1) echo SERVING; return 0 ;;
    0) echo UNKNOWN ;;
    2) echo NOT_SERVING ;;
    3) echo SERVICE_UNKNOWN ;;
    *) echo "status $status" ;;
  esac
  return 1
}

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
  grpc)
    export -f grpc_health_check
    if ! answer=$(timeout "${STRATA_HEALTHCHECK_TIMEOUT:-5}" bash -c 'grpc_health_check "$@"' _ \
        "$host" "$port" "$service" 2>&1); then
      echo "strata-healthcheck: grpc.health.v1 Check of \"$service\" on $address:" \
        "${answer:-no answer within ${STRATA_HEALTHCHECK_TIMEOUT:-5} s}" >&2
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
