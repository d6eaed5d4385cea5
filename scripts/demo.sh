#!/usr/bin/env bash
# Sets up a fresh machine, builds, starts a cluster (strata-expert-store, two strata-worker processes,
# strata-router) on the bundled demo model, and generates a continuation of a text prompt.
#   scripts/demo.sh ["prompt text"]     (MODEL=dir WORKERS=n to change the model or workers)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=${MODEL:-models/strata-demo}
prompt=${1:-"It is a truth universally acknowledged, that"}
out=$(mktemp)
trap 'kill -TERM "$cluster" 2>/dev/null || true; wait "$cluster" 2>/dev/null || true; rm -f "$out"' EXIT
build/bin/strata up --model "$model" --workers "${WORKERS:-2}" >"$out" &
cluster=$!
for _ in $(seq 600); do
  grep -q '^READY ' "$out" && break
  kill -0 "$cluster" 2>/dev/null || { echo "demo: the cluster failed to start" >&2; exit 1; }
  sleep 0.1
done
address=$(sed -n 's/^READY //p' "$out")
[ -n "$address" ] || { echo "demo: the cluster did not become ready" >&2; exit 1; }
echo "cluster ready at $address"
echo "prompt: $prompt"
printf 'continuation:'
build/bin/strata generate --server "$address" --prompt "$prompt" --max-new-tokens 64 \
  --temperature 0.7 --top-p 0.9 --seed 1 --stream
