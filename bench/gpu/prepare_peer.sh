#!/usr/bin/env bash
# Copies llama.cpp's peer recipe (../shared/tools/llama-peer) into .peer/llama-peer for
# bench/gpu/peer_call.sh, with one change: llama-bench's prompt and generation lengths come from
# PP and TG (default 128 each, as the recipe has them) instead of fixed -p 128 -n 128, so a call
# can ask for pp512, pp4096 and tg128 at once. .peer is ignored by git; carry it in the call.
#   bash bench/gpu/prepare_peer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
src=../shared/tools/llama-peer
[ -d "$src" ] || { echo "no $src" >&2; exit 1; }
rm -rf .peer/llama-peer && mkdir -p .peer && cp -r "$src" .peer/
sed -i 's/-p 128 -n 128 -ngl 99/-p "${PP:-128}" -n "${TG:-128}" -ngl 99/' .peer/llama-peer/bench.sh
grep -q 'PP:-128' .peer/llama-peer/bench.sh || { echo "bench.sh changed upstream: edit by hand" >&2; exit 1; }
echo "prepared .peer/llama-peer ($(cat .peer/llama-peer/LLAMA_CPP_COMMIT))"
