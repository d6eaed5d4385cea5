#!/usr/bin/env bash
# Workers on another host, played by two network namespaces on this one: the router in one,
# strata-expert-store and two gRPC-transport workers in the other ("host B", with its own /dev/shm
# and IPC namespace, so nothing but the network joins them), linked by a veth pair. Checks:
#   1. health SERVING through the link;
#   2. greedy tokens through the split equal those of `strata up` with every process on this
#      host (same prompt, same seed);
#   3. a long greedy request survives worker 1 SIGKILLed mid-generation and restarted (as a
#      supervisor would): it completes with the undisturbed tokens, and the router says it
#      ran the worker's experts on the other and took it back.
# Prints PASS/FAIL lines and exits non-zero on a failure; removes the namespaces and stops every
# process it started on exit. Root (network namespaces need CAP_NET_ADMIN).
#
# Environment: BIN (default build/bin), MODEL (models/strata-demo), ACTIVATIONS (f32 or fp8:
# the router's --expert-activations), LONG_TOKENS (1500), THREADS (1 per process),
# NETNS_BENCH=DIR to also run `strata bench` through the split and write its records into DIR,
# NETNS_KEEP=1 to leave everything up (for manual runs; prints how to reach it).
# Exit status 77 when network namespaces cannot be made here (an unprivileged container).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-$ROOT/build/bin}
MODEL=${MODEL:-$ROOT/models/strata-demo}
ACTIVATIONS=${ACTIVATIONS:-f32}
LONG_TOKENS=${LONG_TOKENS:-1500}
THREADS=${THREADS:-1}
PROMPT="In the beginning"
SEED=7
ID=$$
NS_R=strata-r$ID                         # the router's "host"
NS_W=strata-w$ID                         # the workers' "host"
ADDR_R=10.77.0.1 ADDR_W=10.77.0.2
WORK=$(mktemp -d /tmp/strata-netns.XXXXXX)
failures=0
pids=()

pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
die() { echo "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: network namespaces need root"; exit 77; fi
if ! command -v ip >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
fi
for b in strata strata-router strata-worker strata-expert-store; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing: build first (scripts/build.sh)"
done

cleanup() {
  local rc=$?
  if [ "${NETNS_KEEP:-0}" = 1 ] && [ $rc -eq 0 ]; then
    echo "left up: ip netns exec $NS_R $BIN/strata generate --server 127.0.0.1:50051 ..."
    return
  fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  ip netns del "$NS_R" 2>/dev/null || true
  ip netns del "$NS_W" 2>/dev/null || true
  if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then rm -rf "$WORK"; else echo "logs kept in $WORK"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Every strata process of the cluster carries this token (the internal listeners are TCP).
STRATA_CLUSTER_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export STRATA_CLUSTER_TOKEN

# The JSON token ids of `strata generate`'s output file $1.
ids_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token_ids"])' "$1"; }
# How many leading token ids of files $1 and $2 agree, "K of N".
agree() {
  python3 -c 'import json,sys
a, b = (json.load(open(f))["token_ids"] for f in sys.argv[1:3])
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"{k} of {len(a)}")' "$1" "$2"
}
# Token ids of $1 against the reference $2: PASS/FAIL with f32 activations (exact); with fp8
# (approximate: ties between near-equal logits may go the other way) only how far they agree.
same_tokens() {  # $1 output, $2 reference, $3 what
  if [ "$(ids_of "$1")" = "$(ids_of "$2")" ]; then
    pass "$3"
  elif [ "$ACTIVATIONS" = fp8 ]; then
    echo "INFO: fp8 activations: $3: the greedy tokens agree for the first $(agree "$1" "$2")"
  else
    fail "$3: the tokens differ after $(agree "$1" "$2")"
  fi
}
count_of() { python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["token_ids"]))' "$1"; }
# strata generate through server $2 (run with prefix $1, e.g. "ip netns exec NS"), $3 tokens,
# output to file $4.
generate() {
  $1 "$BIN/strata" generate --server "$2" --prompt "$PROMPT" --max-new-tokens "$3" \
    --temperature 0 --seed $SEED >"$4"
}

# Network namespaces may be refused (an unprivileged container): a skip, not a failure.
if ! ip netns add "$NS_R" 2>"$WORK/netns.err"; then
  echo "SKIP: cannot create network namespaces here: $(cat "$WORK/netns.err")"
  exit 77
fi

# --- The reference: every process on this host (strata up, shared memory). ---
t0=$(now)
"$BIN/strata" up --model "$MODEL" --workers 2 --threads "$THREADS" >"$WORK/up.out" 2>"$WORK/up.log" &
UP=$!
pids+=("$UP")
for _ in $(seq 600); do grep -q '^READY ' "$WORK/up.out" && break; sleep 0.1; done
grep -q '^READY ' "$WORK/up.out" || die "strata up did not become ready: $(tail -5 "$WORK/up.log")"
UP_ADDR=$(sed -n 's/^READY //p' "$WORK/up.out" | head -1)
generate "" "$UP_ADDR" 64 "$WORK/ref-short.json"
generate "" "$UP_ADDR" "$LONG_TOKENS" "$WORK/ref-long.json"
kill -TERM "$UP" && wait "$UP" || true
echo "reference run on one host: $(count_of "$WORK/ref-short.json") and" \
  "$(count_of "$WORK/ref-long.json") greedy tokens ($(since "$t0") s)"

# --- Two "hosts": network namespaces joined by a veth pair. ---
ip netns add "$NS_W"
ip link add "veth-r$ID" netns "$NS_R" type veth peer name "veth-w$ID" netns "$NS_W"
ip -n "$NS_R" addr add "$ADDR_R/24" dev "veth-r$ID"
ip -n "$NS_W" addr add "$ADDR_W/24" dev "veth-w$ID"
for ns in "$NS_R" "$NS_W"; do
  ip -n "$ns" link set lo up
done
ip -n "$NS_R" link set "veth-r$ID" up
ip -n "$NS_W" link set "veth-w$ID" up
# The link's round trip for one decode step's messages (1 KiB each way: strata-demo's hidden
# row in float32), TCP ping-pong in Python, 2000 times.
ip netns exec "$NS_W" python3 "$ROOT/scripts/tcp_pingpong.py" server "$ADDR_W" 1024 >"$WORK/pong.out" &
PONG=$!
for _ in $(seq 50); do grep -q up "$WORK/pong.out" && break; sleep 0.1; done
if rtt=$(ip netns exec "$NS_R" python3 "$ROOT/scripts/tcp_pingpong.py" client "$ADDR_W" 1024); then
  pass "veth link $ADDR_R <-> $ADDR_W: TCP round trip $rtt"
else
  die "nothing crosses the veth link"
fi
wait "$PONG" || true

# Host B's own /dev/shm and IPC namespace, held by a process the workers are started into
# (nsenter), as a real second host would have them.
ip netns exec "$NS_W" unshare --ipc --mount --propagation private -- \
  bash -c 'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec sleep infinity' &
HOST_B=$!
pids+=("$HOST_B")
for _ in $(seq 50); do [ "$(cat /proc/$HOST_B/comm 2>/dev/null)" = sleep ] && break; sleep 0.1; done
on_b() { nsenter --target "$HOST_B" --net --mount --ipc -- "$@"; }

start_router() {
  ip netns exec "$NS_R" "$BIN/strata-router" --model="$MODEL" --workers=2 --threads="$THREADS" \
    --listen=127.0.0.1:50051 --internal-listen="$ADDR_R:50053" \
    --expert-activations="$ACTIVATIONS" --log-level=info >"$WORK/router.out" 2>"$WORK/router.log" &
  ROUTER=$!
  pids+=("$ROUTER")
}
start_worker() {  # $1: index. (nsenter execs: $! is the worker itself, not a subshell.)
  nsenter --target "$HOST_B" --net --mount --ipc -- "$BIN/strata-worker" --model="$MODEL" --store-address=127.0.0.1:50052 --router="$ADDR_R:50053" \
    --index="$1" --transport=grpc --listen="$ADDR_W:5006$1" --threads="$THREADS" \
    --log-level=info >>"$WORK/worker$1.log" 2>&1 &
  WORKER[$1]=$!
  pids+=("${WORKER[$1]}")
}
declare -a WORKER
t0=$(now)
start_router
nsenter --target "$HOST_B" --net --mount --ipc -- "$BIN/strata-expert-store" --model="$MODEL" --listen=127.0.0.1:50052 \
  --segment-prefix="strata-netns-$ID" >"$WORK/store.out" 2>"$WORK/store.log" &
pids+=("$!")
for _ in $(seq 300); do grep -q '^READY ' "$WORK/store.out" && break; sleep 0.1; done
grep -q '^READY ' "$WORK/store.out" || die "strata-expert-store on host B: $(tail -3 "$WORK/store.log")"
start_worker 0
start_worker 1
R="127.0.0.1:50051"
serving() { ip netns exec "$NS_R" "$ROOT/deploy/healthcheck.sh" grpc "$R" >/dev/null 2>&1; }
for _ in $(seq 300); do serving && break; sleep 0.2; done
if serving; then
  pass "health SERVING through the split ($(since "$t0") s after the router started)"
else
  die "not SERVING: $(tail -5 "$WORK/router.log")"
fi
if on_b ls /dev/shm | grep -q "strata-netns-$ID" && ! ls /dev/shm | grep -q "strata-netns-$ID"; then
  pass "host B's expert store is in its own /dev/shm"
else
  fail "host B's expert store is not where it should be"
fi

# --- Greedy tokens through the split against the one-host run. ---
IN_R="ip netns exec $NS_R"
generate "$IN_R" "$R" 64 "$WORK/split-short.json"
same_tokens "$WORK/split-short.json" "$WORK/ref-short.json" \
  "64 greedy tokens through the split equal the one-host run"
generate "$IN_R" "$R" "$LONG_TOKENS" "$WORK/split-long.json"
same_tokens "$WORK/split-long.json" "$WORK/ref-long.json" \
  "$LONG_TOKENS greedy tokens through the split equal the one-host run"

# --- Worker 1 SIGKILLed mid-request and restarted. ---
generate "$IN_R" "$R" "$LONG_TOKENS" "$WORK/killed.json" &
GEN=$!
sleep 1.5
if kill -0 "$GEN" 2>/dev/null; then
  kill -KILL "${WORKER[1]}"
  wait "${WORKER[1]}" 2>/dev/null || true
  echo "worker 1 (pid ${WORKER[1]}) SIGKILLed while the request ran"
  sleep 0.2
  start_worker 1
else
  fail "the request ended before the kill (raise LONG_TOKENS)"
fi
if wait "$GEN"; then
  same_tokens "$WORK/killed.json" "$WORK/split-long.json" \
    "the request across the kill completed with the undisturbed $LONG_TOKENS tokens"
else
  fail "the request across the kill failed: $(cat "$WORK/killed.json")"
fi
if grep -qE "expert worker 1 (failed during layer|is gone)" "$WORK/router.log"; then
  pass "the router ran worker 1's experts on worker 0: $(grep -m1 -oE "expert worker 1 (failed during layer|is gone)[^;]*" "$WORK/router.log")"
else
  fail "the router's log does not say it rerouted worker 1"
fi
for _ in $(seq 100); do grep -q "expert worker 1 is back" "$WORK/router.log" && break; sleep 0.1; done
if grep -q "expert worker 1 is back" "$WORK/router.log" && serving; then
  gone=$(grep -m1 -E "expert worker 1 (failed during layer|is gone)" "$WORK/router.log" | cut -c1-23)
  back=$(grep -m1 "expert worker 1 is back" "$WORK/router.log" | cut -c1-23)
  took=$(awk -v a="$(date -d "$gone" +%s.%N)" -v b="$(date -d "$back" +%s.%N)" \
    'BEGIN { printf "%.2f", b - a }')
  pass "worker 1 registered again over the link, $took s after the router lost it; health SERVING"
else
  fail "worker 1 did not come back: $(tail -3 "$WORK/worker1.log")"
fi
generate "$IN_R" "$R" 64 "$WORK/after.json"
same_tokens "$WORK/after.json" "$WORK/split-short.json" \
  "after the restart the greedy tokens are those before the kill"

# --- Optional: strata bench through the split (records for bench/results). ---
if [ -n "${NETNS_BENCH:-}" ]; then
  mkdir -p "$NETNS_BENCH"
  variant=netns-grpc
  [ "$ACTIVATIONS" = fp8 ] && variant=netns-grpc-fp8
  dev_r="veth-r$ID"
  tx0=$(ip netns exec "$NS_R" cat "/sys/class/net/$dev_r/statistics/tx_bytes")
  rx0=$(ip netns exec "$NS_R" cat "/sys/class/net/$dev_r/statistics/rx_bytes")
  stats0=$($IN_R "$BIN/strata" stats --admin "$ADDR_R:50053")
  $IN_R "$BIN/strata" bench --server "$R" --model "$MODEL" --input-len 128 --output-len 128 \
    --runs 3 --concurrency 1,8 --weights bf16 --mode cluster --gpus 0 \
    --machine "${NETNS_MACHINE:-2-core dev VM (CPU only)}" \
    --note "router and workers in two network namespaces over a veth pair, --transport grpc, --expert-activations $ACTIVATIONS" \
    --out "$NETNS_BENCH/strata-strata-demo-bf16-cluster-cpu-in128-out128-$variant.json"
  stats1=$($IN_R "$BIN/strata" stats --admin "$ADDR_R:50053")
  tx1=$(ip netns exec "$NS_R" cat "/sys/class/net/$dev_r/statistics/tx_bytes")
  rx1=$(ip netns exec "$NS_R" cat "/sys/class/net/$dev_r/statistics/rx_bytes")
  python3 - "$stats0" "$stats1" $((tx1 - tx0)) $((rx1 - rx0)) "$ACTIVATIONS" <<'EOF'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tokens = b["generated_tokens"] - a["generated_tokens"] + b["prompt_tokens"] - a["prompt_tokens"]
sent = b["expert_wire_bytes_sent"] - a["expert_wire_bytes_sent"]
received = b["expert_wire_bytes_received"] - a["expert_wire_bytes_received"]
veth = int(sys.argv[3]) + int(sys.argv[4])
print(f"bench ({sys.argv[5]}): {tokens} tokens (prompt + generated) through the router; "
      f"expert messages {sent / tokens:.0f} B/token sent, {received / tokens:.0f} B/token received; "
      f"veth both ways {veth / tokens:.0f} B/token")
EOF
fi

if [ "$failures" -eq 0 ]; then
  echo "PASS: netns split, $ACTIVATIONS activations: every check passed"
else
  echo "FAIL: netns split, $ACTIVATIONS activations: $failures check(s) failed"
fi
[ "$failures" -eq 0 ]
