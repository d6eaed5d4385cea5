#!/usr/bin/env bash
# Builds the CPU image and runs deploy/docker-compose.cpu.yml for real on this machine, then
# checks the running cluster from outside, through its published ports:
#   1. grpc.health.v1 Check on the published client port reaches SERVING (a Python gRPC client,
#      and deploy/healthcheck.sh's bash one from the host), and Docker reports the router's and
#      the expert store's own health checks (the same RPC, run inside the containers) healthy;
#   2. a Generate through the published client port (the `strata generate` client, run from the
#      image on the host network) returns the tokens asked for;
#   3. POST /v1/chat/completions and GET /v1/models, /health and /metrics through the published
#      HTTP port (curl);
#   4. a long greedy Generate in flight while a worker is SIGKILLed, twice: worker-0's process
#      killed from the host (a crash, as the OOM killer would), then worker-1 with `docker kill`.
#      Each request completes with every token, identical to an undisturbed run of the same
#      request, and the router reran layers around the dead worker. Docker's restart policy
#      restarts the crashed worker; `docker kill` counts as a manual stop for Docker (no
#      restart: checked), so that worker is started again with `docker-compose start`. Both
#      register again and health is SERVING again;
#   5. `docker-compose stop` (SIGTERM, ordered shutdown) leaves no shared-memory segment in the
#      shm container's /dev/shm, and after `docker-compose down` nothing of the project is left
#      (containers, network) and no new segment appeared in the host's /dev/shm.
# Prints a PASS/FAIL line per check, the time of each phase and a summary; exits non-zero when
# anything failed. The containers are removed on exit, whatever happened.
#
# Needs root (or sudo) on a Debian 12 machine: it installs docker.io, docker-compose, debootstrap,
# curl and python3-grpcio with apt-get, starts dockerd when no engine answers, and, with no image
# registry reachable, makes the base image itself: `debootstrap --variant=minbase bookworm` into a
# temporary root, imported as local/bookworm (kept for later runs).
#
# Settings (environment):
#   STRATA_BASE_IMAGE   the CPU variant's build and runtime base (the Dockerfile's
#                       DEBIAN_BUILD_IMAGE and DEBIAN_RUNTIME_IMAGE); default local/bookworm,
#                       made with debootstrap when absent. debian:bookworm works where Docker Hub
#                       is reachable.
#   STRATA_IMAGE        the tag built and run (default strata:latest)
#   STRATA_PORT, STRATA_HTTP_PORT   the published ports (default 50051, 8000)
#   STRATA_THREADS      the router's and workers' --threads (default 2), STRATA_CPUS their quota
#   STRATA_MODEL_DIR, STRATA_MODEL_NAME  the model (default models/strata-demo, served as
#                       strata-demo); the checks assume a model that fits 1500 tokens of context
#   JOBS                compile jobs of the image build (default 2)
#   COMPOSE_RUN_KEEP=1  leave the cluster running at the end (no down, no shared-memory check)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
compose_file=deploy/docker-compose.cpu.yml
project=strata-compose-run
export STRATA_IMAGE=${STRATA_IMAGE:-strata:latest}
export STRATA_PORT=${STRATA_PORT:-50051}
export STRATA_HTTP_PORT=${STRATA_HTTP_PORT:-8000}
export STRATA_THREADS=${STRATA_THREADS:-2}
export STRATA_MODEL_NAME=${STRATA_MODEL_NAME:-strata-demo} # the compose file's default model
base_image=${STRATA_BASE_IMAGE:-local/bookworm}
python=/usr/bin/python3 # Debian's, where apt installs python3-grpcio

# ---- reporting ------------------------------------------------------------------------------
passed=0
failed=0
results=()
phases=()
pass() { echo "PASS: $*"; results+=("PASS: $*"); passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; results+=("FAIL: $*"); failed=$((failed + 1)); }
check() { # check DESCRIPTION COMMAND...: PASS when the command succeeds
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}
start_time=$(date +%s)
phase_start=$start_time
phase() { # ends the current phase (named $1), records its duration
  local now
  now=$(date +%s)
  phases+=("$(printf '%-34s %5d s' "$1" $((now - phase_start)))")
  phase_start=$now
}
log() { echo "compose_run: $*"; }

summary() {
  echo
  echo "==== compose_run summary ===="
  local p
  for p in "${phases[@]}"; do echo "  $p"; done
  printf '  %-34s %5d s\n' total $(($(date +%s) - start_time))
  for p in "${results[@]}"; do echo "  $p"; done
  echo "  $passed passed, $failed failed"
  if [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
}

# ---- cleanup --------------------------------------------------------------------------------
tmp=$(mktemp -d)
background=()
compose() { docker-compose -p "$project" -f "$compose_file" "$@"; }
cleanup() {
  local status=$?
  local pid
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ "${COMPOSE_RUN_KEEP:-0}" != 1 ] && command -v docker-compose >/dev/null 2>&1 &&
     [ -n "${STRATA_CLUSTER_TOKEN:-}" ]; then
    compose down --remove-orphans --timeout 60 >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp"
  summary
  if [ "$failed" -gt 0 ] || [ "$passed" -eq 0 ]; then exit 1; fi
  exit "$status"
}
trap cleanup EXIT
trap 'fail "interrupted"; exit 1' INT TERM

# ---- tools and the engine ---------------------------------------------------------------------
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v curl >/dev/null 2>&1 || need+=(curl)
"$python" -c 'import grpc' 2>/dev/null || need+=(python3-grpcio)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Docker Engine's own CLI builds with BuildKit (which skips the CUDA variant's stages); a
# static CLI without the buildx plugin cannot, so prefer Debian's when that is what is there.
docker_build=(docker build)
if ! docker buildx version >/dev/null 2>&1 && [ -x /usr/bin/docker ]; then
  docker_build=(/usr/bin/docker build)
fi
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: /var/log/strata-dockerd.log)"
  $SUDO sh -c 'nohup dockerd >/var/log/strata-dockerd.log 2>&1 &'
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { fail "dockerd did not start (see /var/log/strata-dockerd.log)"; exit 1; }
fi
phase "tools and dockerd"

if ! docker image inspect "$base_image" >/dev/null 2>&1; then
  if [ "$base_image" != local/bookworm ]; then
    log "pulling $base_image"
    docker pull "$base_image" >/dev/null || { fail "cannot pull $base_image"; exit 1; }
  else
    log "making $base_image with debootstrap (minbase bookworm)"
    rootfs="$tmp/rootfs"
    $SUDO debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian \
      >"$tmp/debootstrap.log" 2>&1 || { tail -20 "$tmp/debootstrap.log"; fail "debootstrap"; exit 1; }
    $SUDO tar -C "$rootfs" -c . | docker import - "$base_image" >/dev/null
    $SUDO rm -rf "$rootfs"
  fi
fi
phase "base image ($base_image)"

# ---- image ----------------------------------------------------------------------------------
log "building $STRATA_IMAGE from deploy/Dockerfile (VARIANT=cpu, base $base_image; log: $tmp/build.log)"
if DOCKER_BUILDKIT=1 "${docker_build[@]}" -f deploy/Dockerfile --build-arg VARIANT=cpu \
    --build-arg DEBIAN_BUILD_IMAGE="$base_image" --build-arg DEBIAN_RUNTIME_IMAGE="$base_image" \
    --build-arg JOBS="${JOBS:-2}" -t "$STRATA_IMAGE" . >"$tmp/build.log" 2>&1; then
  pass "docker build of the CPU image ($STRATA_IMAGE, $(docker image inspect -f '{{.Size}}' "$STRATA_IMAGE" |
    awk '{printf "%.0f MB", $1 / 1e6}'))"
else
  tail -40 "$tmp/build.log"
  fail "docker build of the CPU image"
  exit 1
fi
phase "image build"

# ---- up -------------------------------------------------------------------------------------
STRATA_CLUSTER_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export STRATA_CLUSTER_TOKEN
compose down --remove-orphans --timeout 30 >/dev/null 2>&1 || true
# The host's /dev/shm entries of the containers' uid (10001), before: the cluster's segments
# belong in the shm container's own /dev/shm, never here. (Other programs' segments on the host
# come and go and are not looked at.)
host_shm() { find /dev/shm -mindepth 1 -maxdepth 1 -uid 10001 -printf '%f\n' | sort; }
host_shm >"$tmp/host-shm.before"
# --no-build: the image was built above with BuildKit (Compose 1.29 would use the legacy builder).
if ! compose up -d --no-build >"$tmp/up.log" 2>&1; then
  cat "$tmp/up.log"
  fail "docker-compose up -d"
  exit 1
fi
pass "docker-compose -f $compose_file up -d"
container() { compose ps -q "$1"; }

# grpc.health.v1 Check through the published port, with Python's gRPC (no generated code: the
# request and the response are a few protobuf bytes).
cat >"$tmp/health.py" <<'EOF'
import sys, time
import grpc
target, service, wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
names = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
check = grpc.insecure_channel(target).unary_unary("/grpc.health.v1.Health/Check")
request = (b"\x0a" + bytes([len(service)]) + service.encode()) if service else b""
end, last = time.time() + wait_s, "no answer"
while True:
    try:
        answer = check(request, timeout=3)
        status = answer[1] if len(answer) >= 2 and answer[0] == 0x08 else 0
        last = names.get(status, str(status))
        if status == 1:
            break
    except grpc.RpcError as e:
        last = e.code().name
    if time.time() >= end:
        break
    time.sleep(0.25)
print(last)
sys.exit(0 if last == "SERVING" else 1)
EOF
health() { "$python" "$tmp/health.py" "127.0.0.1:$STRATA_PORT" "${2:-}" "$1"; }

log "waiting for grpc.health.v1 SERVING on 127.0.0.1:$STRATA_PORT"
if status=$(health 600); then
  pass "grpc.health.v1 Check on the published port 127.0.0.1:$STRATA_PORT: $status"
else
  fail "grpc.health.v1 Check on 127.0.0.1:$STRATA_PORT: $status after 600 s"
  compose logs --tail 50 >&2 || true
  exit 1
fi
phase "up to SERVING"
status=$(health 10 strata.v1.Generation) || true
check "grpc.health.v1 Check of strata.v1.Generation: $status" [ "$status" = SERVING ]
answer=$(deploy/healthcheck.sh grpc "127.0.0.1:$STRATA_PORT" 2>&1) && ok=0 || ok=$?
check "strata-healthcheck grpc (bash) from the host on 127.0.0.1:$STRATA_PORT ${answer:+($answer)}" [ "$ok" -eq 0 ]
# Docker's view: the containers' own health checks (strata-healthcheck grpc inside them).
docker_health() { docker inspect -f '{{.State.Health.Status}}' "$(container "$1")" 2>/dev/null; }
for service in expert-store router; do
  state=""
  for _ in $(seq 60); do
    state=$(docker_health "$service")
    [ "$state" = healthy ] && break
    sleep 1
  done
  check "Docker health check of $service: $state" [ "$state" = healthy ]
done
published=$(docker port "$(container router)" | awk '{print $1}' | sort -u | tr '\n' ' ')
check "the router publishes only 50051/tcp and 8000/tcp ($published)" [ "$published" = "50051/tcp 8000/tcp " ]
check "the expert store publishes nothing" [ -z "$(docker port "$(container expert-store)")" ]

# ---- Generate through the published client port ---------------------------------------------
# The `strata` client of the image, on the host's network: it reaches the cluster the way any
# client would, through the published port.
strata_client() {
  docker run --rm --network host --entrypoint strata "$STRATA_IMAGE" "$@"
}
prompt="In the beginning"
if out=$(strata_client generate --server "127.0.0.1:$STRATA_PORT" --prompt "$prompt" \
      --max-new-tokens 32 --ignore-eos 2>"$tmp/generate.err"); then
  tokens=$("$python" -c 'import json,sys; d=json.loads(sys.argv[1]); print(len(d["token_ids"]), d["finish_reason"], d["usage"]["completion_tokens"])' "$out")
  check "Generate through 127.0.0.1:$STRATA_PORT: 32 tokens, FINISH_REASON_LENGTH ($tokens)" \
    [ "$tokens" = "32 FINISH_REASON_LENGTH 32" ]
else
  fail "Generate through 127.0.0.1:$STRATA_PORT: $(cat "$tmp/generate.err")"
fi

# ---- the HTTP API through the published HTTP port ---------------------------------------------
http="http://127.0.0.1:$STRATA_HTTP_PORT"
if body=$(curl -sS --fail-with-body --max-time 120 "$http/v1/chat/completions" \
      -H 'Content-Type: application/json' \
      -d '{"model": "'"$STRATA_MODEL_NAME"'", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 0}' 2>&1); then
  verdict=$("$python" -c '
import json, sys
d = json.loads(sys.argv[1])
c = d["choices"][0]
ok = d["object"] == "chat.completion" and c["message"]["role"] == "assistant" and \
     isinstance(c["message"]["content"], str) and d["usage"]["completion_tokens"] > 0
print("ok" if ok else "bad", d["usage"]["completion_tokens"], "tokens,", c["finish_reason"])' "$body" 2>&1) || true
  check "POST $http/v1/chat/completions: ${verdict#ok }" [ "${verdict%% *}" = ok ]
else
  fail "POST $http/v1/chat/completions: $body"
fi
models=$(curl -sS --max-time 10 "$http/v1/models" 2>&1) || true
check "GET $http/v1/models lists the model as $STRATA_MODEL_NAME" grep -q "\"id\": *\"$STRATA_MODEL_NAME\"" <<<"$models"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$http/health") || true
check "GET $http/health: $code" [ "$code" = 200 ]
metric() { # metric NAME [LABELS]: its value in a fresh scrape (empty when absent)
  local name=$1
  [ -z "${2:-}" ] || name+="{$2}"
  # (awk reads to the end: quitting early would fail curl with SIGPIPE under pipefail)
  curl -sS --max-time 10 "$http/metrics" 2>/dev/null | awk -v n="$name" '$1 == n && !v {v = $2} END {print v}'
}
curl -sS --max-time 10 "$http/metrics" >"$tmp/metrics.txt" 2>&1 || true
for name in strata_requests_finished_total strata_generated_tokens_total strata_requests_running \
            strata_kv_blocks_capacity 'strata_worker_connected{worker="0"}' \
            'strata_worker_connected{worker="1"}' strata_time_to_first_token_seconds_count; do
  check "/metrics has $name ($(awk -v n="$name" '$1 == n {print $2}' "$tmp/metrics.txt"))" \
    grep -q "^$name " "$tmp/metrics.txt"
done
finished=$(metric strata_requests_finished_total)
check "/metrics counts the requests so far (strata_requests_finished_total $finished >= 2)" \
  awk -v v="${finished:-0}" 'BEGIN {exit !(v >= 2)}'
phase "Generate, HTTP API, metrics"

# ---- a worker killed mid-generation ---------------------------------------------------------
# The same greedy request, undisturbed, then twice more with a worker SIGKILLed while it runs.
# The router reruns the interrupted layer on the other worker (docs/reliability.md), so each must
# complete with the reference's tokens. Two ways to kill:
# - crash: SIGKILL to the worker's process from outside Docker, as a crash or the kernel's OOM
#   killer would: Docker's restart policy (unless-stopped) restarts the container;
# - docker kill: Docker counts it as a manual stop, like `docker stop`, and no restart policy
#   restarts the container (checked here, then it is started again by hand).
long_tokens=1500 # of the demo model's 2048-token context
long_request=(generate --server "127.0.0.1:$STRATA_PORT" --prompt "$prompt" --max-new-tokens
              "$long_tokens" --ignore-eos --temperature 0)
reference_start=$(date +%s.%N)
strata_client "${long_request[@]}" >"$tmp/reference.json" 2>"$tmp/reference.err" ||
  fail "the undisturbed $long_tokens-token Generate: $(cat "$tmp/reference.err")"
log "undisturbed $long_tokens-token request: $(awk -v a="$reference_start" -v b="$(date +%s.%N)" \
  'BEGIN {printf "%.1f", b - a}') s"

# router_says TEXT: how many lines of the router's log hold TEXT.
router_says() { docker logs "$(container router)" 2>&1 | grep -cF "$1" || true; }
# registered INDEX: the router has worker INDEX connected (its /metrics gauge).
# recovery_times CONTAINER INDEX SINCE: from the router's log and Docker's StartedAt, how long
# after SINCE (seconds since the epoch) the router noticed worker INDEX gone, Docker started the
# container and the router had the worker back. (Timestamps, not the polling above: Docker's
# API answers slowly while it restarts a container.)
recovery_times() {
  local at gone started back
  at() { date -d "$1" +%s.%N 2>/dev/null || echo 0; }
  since() { awk -v a="$2" -v b="$1" 'BEGIN {printf "%.2f s", b - a}'; }
  gone=$(docker logs -t "$(container router)" 2>&1 | grep -F "expert worker $2 is gone" | tail -1 | cut -d' ' -f1)
  back=$(docker logs -t "$(container router)" 2>&1 | grep -F "expert worker $2 is back" | tail -1 | cut -d' ' -f1)
  started=$(docker inspect -f '{{.State.StartedAt}}' "$1")
  if awk -v g="$(at "$gone")" -v s="$3" 'BEGIN {exit !(g >= s)}'; then
    printf 'noticed gone %s, ' "$(since "$(at "$gone")" "$3")"
  fi
  printf 'container started %s, registered %s' "$(since "$(at "$started")" "$3")" "$(since "$(at "$back")" "$3")"
}
registered() { [ "$(metric strata_worker_connected "worker=\"$1\"")" = 1 ]; }

kill_mid_generation() { # kill_mid_generation SERVICE INDEX crash|docker-kill
  local service=$1 index=$2 how=$3
  local worker restarts_before reroutes_before generated_before client_pid killed=0 kill_time
  worker=$(container "$service")
  restarts_before=$(docker inspect -f '{{.RestartCount}}' "$worker")
  reroutes_before=$(metric strata_reroutes_total)
  local gone_before back_before
  gone_before=$(router_says "expert worker $index is gone")
  back_before=$(router_says "expert worker $index is back")
  generated_before=$(metric strata_generated_tokens_total)
  strata_client "${long_request[@]}" >"$tmp/$how.json" 2>"$tmp/$how.err" &
  client_pid=$!
  background=("$client_pid")
  # Mid-generation: the request is running and has produced at least 50 tokens.
  local running generated
  for _ in $(seq 600); do
    running=$(metric strata_requests_running)
    generated=$(metric strata_generated_tokens_total)
    if [ "${running:-0}" != 0 ] &&
       awk -v g="${generated:-0}" -v b="${generated_before:-0}" 'BEGIN {exit !(g - b >= 50)}'; then
      if [ "$how" = crash ]; then
        local pid
        pid=$(docker inspect -f '{{.State.Pid}}' "$worker")
        kill_time=$(date +%s.%N)
        $SUDO kill -KILL "$pid" && killed=1
      else
        kill_time=$(date +%s.%N)
        docker kill "$worker" >/dev/null && killed=1
      fi
      log "$how: $service SIGKILLed after $(awk -v g="$generated" -v b="$generated_before" 'BEGIN {print g - b}') tokens"
      break
    fi
    kill -0 "$client_pid" 2>/dev/null || break
    sleep 0.1
  done
  check "$how: $service SIGKILLed while the request was generating" [ "$killed" -eq 1 ]
  local client_status=0 same
  wait "$client_pid" || client_status=$?
  background=()
  if [ "$client_status" -eq 0 ]; then
    same=$("$python" -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
n = int(sys.argv[3])
print(len(b["token_ids"]), b["finish_reason"],
      "identical" if a["token_ids"] == b["token_ids"] and len(a["token_ids"]) == n else "DIFFERENT")
' "$tmp/reference.json" "$tmp/$how.json" "$long_tokens" 2>&1) || true
    check "$how: the request in flight completed with all its tokens, identical to the undisturbed run ($same)" \
      [ "$same" = "$long_tokens FINISH_REASON_LENGTH identical" ]
  else
    fail "$how: the request in flight failed when $service was killed: $(cat "$tmp/$how.err")"
  fi
  # The router says so when it notices the dead worker and hands its experts to the other one.
  # (strata_reroutes_total counts only layers that were inside their exchange with the worker
  # when it died; a death between two exchanges is found before the next one sends anything.)
  local reroutes
  reroutes=$(metric strata_reroutes_total)
  check "$how: the router noticed $service gone and ran its experts on the other worker (log; layers rerun: ${reroutes_before:-?} -> ${reroutes:-?})" \
    [ "$(router_says "expert worker $index is gone")" -gt "$gone_before" ]
  local restarts state back=""
  if [ "$how" = crash ]; then
    for _ in $(seq 240); do
      restarts=$(docker inspect -f '{{.RestartCount}}' "$worker")
      state=$(docker inspect -f '{{.State.Status}}' "$worker")
      if [ "$restarts" -gt "$restarts_before" ] && [ "$state" = running ] && registered "$index"; then
        back="after the kill: $(recovery_times "$worker" "$index" "$kill_time")"
        break
      fi
      sleep 0.5
    done
    check "$how: Docker's restart policy restarted $service (restart count $restarts_before -> $restarts) and it registered again${back:+ ($back)}" \
      [ -n "$back" ]
  else
    sleep 5
    restarts=$(docker inspect -f '{{.RestartCount}}' "$worker")
    state=$(docker inspect -f '{{.State.Status}}' "$worker")
    local stayed_down=0
    [ "$state" = exited ] && [ "$restarts" -eq "$restarts_before" ] && stayed_down=1
    check "$how: Docker treats docker kill as a manual stop: $service stays down ($state, restart count $restarts)" \
      [ "$stayed_down" -eq 1 ]
    local start_time
    start_time=$(date +%s.%N)
    compose start "$service" >/dev/null 2>&1 || true
    for _ in $(seq 240); do
      if [ "$(docker inspect -f '{{.State.Status}}' "$worker")" = running ] && registered "$index"; then
        back="after the start: $(recovery_times "$worker" "$index" "$start_time")"
        break
      fi
      sleep 0.5
    done
    check "$how: docker-compose start $service brought it back and it registered again${back:+ ($back)}" \
      [ -n "$back" ]
  fi
  check "$how: the router gave $service its experts back (log)" \
    [ "$(router_says "expert worker $index is back")" -gt "$back_before" ]
  local status
  status=$(health 60) || true
  check "$how: grpc.health.v1 SERVING again ($status)" [ "$status" = SERVING ]
}
kill_mid_generation worker-0 0 crash
phase "worker-0 crashed mid-generation"
kill_mid_generation worker-1 1 docker-kill
phase "worker-1 docker-killed mid-generation"
worker_restarts=$(metric strata_worker_restarts_total)
check "/metrics counts the re-registrations (strata_worker_restarts_total ${worker_restarts:-?} >= 2)" \
  awk -v v="${worker_restarts:-0}" 'BEGIN {exit !(v >= 2)}'

# ---- shutdown and shared memory -------------------------------------------------------------
if [ "${COMPOSE_RUN_KEEP:-0}" = 1 ]; then
  log "COMPOSE_RUN_KEEP=1: the cluster stays up (docker-compose -p $project -f $compose_file down)"
  exit 0
fi
shm_container=$(container shm)
shm_mounts=$(grep -c "/containers/$shm_container/mounts/shm" /proc/mounts || true)
check "while running, the shm container's /dev/shm is a tmpfs of its own on the host ($shm_mounts mount)" \
  [ "$shm_mounts" -ge 1 ]
docker exec "$shm_container" ls -A /dev/shm >"$tmp/shm.running" 2>&1 || true
check "while running, the shm container's /dev/shm holds the cluster's segments ($(wc -l <"$tmp/shm.running") entries: $(head -c 200 "$tmp/shm.running" | tr '\n' ' '))" \
  grep -q '^strata' "$tmp/shm.running"
# The strata processes first, by SIGTERM as `down` would stop them, the shm container (the
# owner of the IPC namespace) still up, so its /dev/shm can be looked at afterwards.
compose stop --timeout 60 expert-store router worker-0 worker-1 >/dev/null 2>&1 ||
  fail "docker-compose stop of the expert store, router and workers"
left=$(docker exec "$shm_container" ls -A /dev/shm 2>&1) || left="(cannot list: $left)"
check "after an ordered stop, nothing is left in the shm container's /dev/shm (${left:-empty})" [ -z "$left" ]
exit_codes=$(for s in expert-store router worker-0 worker-1; do
  printf '%s=%s ' "$s" "$(docker inspect -f '{{.State.ExitCode}}' "$(container "$s")")"; done)
check "expert store, router and workers exited 0 on SIGTERM ($exit_codes)" \
  [ "$exit_codes" = "expert-store=0 router=0 worker-0=0 worker-1=0 " ]
compose down --remove-orphans --timeout 60 >"$tmp/down.log" 2>&1 || fail "docker-compose down: $(cat "$tmp/down.log")"
remaining=$(docker ps -aq --filter "label=com.docker.compose.project=$project" | wc -l)
check "docker-compose down left no container of the project ($remaining)" [ "$remaining" -eq 0 ]
networks=$(docker network ls -q --filter "label=com.docker.compose.project=$project" | wc -l)
check "docker-compose down left no network of the project ($networks)" [ "$networks" -eq 0 ]
host_shm >"$tmp/host-shm.after"
new=$(comm -13 "$tmp/host-shm.before" "$tmp/host-shm.after" | tr '\n' ' ')
check "nothing of uid 10001 appeared in the host's /dev/shm (${new:-none})" [ -z "$new" ]
shm_mounts=$(grep -c "/containers/$shm_container/mounts/shm" /proc/mounts || true)
check "the shm container's /dev/shm mount is gone from the host ($shm_mounts left)" [ "$shm_mounts" -eq 0 ]
phase "stop, down, shared memory"
