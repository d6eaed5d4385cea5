#!/usr/bin/env bash
# The demo model through a CPU cluster (one worker, one thread a process), batch 1, held-out
# text prompts: decoding without speculation, with prompt lookup and with the draft model
# (models/strata-demo-draft), greedy and sampled (T = 0.8). Each configuration a cluster of its
# own; `strata bench` records in OUT_DIR, a table last.
#   bash bench/speculation/draft_model_bench.sh [BIN_DIR] OUT_DIR
set -uo pipefail
bin=${1:-build/bin}; out=${2:-/tmp/draft-bench}
mkdir -p "$out"
commit=$(git rev-parse --short HEAD)
run() {  # NAME TEMPERATURE UP_FLAGS...
  local name=$1 temp=$2; shift 2
  "$bin/strata" up --model models/strata-demo --workers 1 --threads 1 --port 0 "$@" \
    >"$out/up-$name.out" 2>"$out/up-$name.log" &
  local pid=$! addr=""
  for _ in $(seq 300); do
    addr=$(awk '/^READY/{print $2}' "$out/up-$name.out"); [ -n "$addr" ] && break; sleep 0.2
  done
  if [ -z "$addr" ]; then echo "$name: no READY"; tail -3 "$out/up-$name.log"; kill $pid; return; fi
  "$bin/strata" bench --server "$addr" --model models/strata-demo \
    --prompts tests/data/heldout/strata-demo-calibration.jsonl --input-len 128 --output-len 128 \
    --runs 8 --warmup 1 --concurrency 1 --temperature "$temp" --mode cluster --gpus 0 \
    --machine '2-core VM (CPU)' --note "$name: $*" --commit "$commit" \
    --out "$out/$name.json" >"$out/bench-$name.txt" 2>&1
  "$bin/strata" stats --server "$addr" >"$out/stats-$name.json" 2>&1
  kill -TERM $pid; wait $pid
}
for temp in 0 0.8; do
  t=${temp/./}
  run "off-t$t" "$temp"
  run "lookup4-t$t" "$temp" --speculative-tokens 4
  run "draft4-t$t" "$temp" --speculative-tokens 4 --speculative-draft-model models/strata-demo-draft
done
python3 - "$out" <<'PY'
import json, sys, glob, os
print('run | decode tok/s mean | P50 | acceptance | drafted')
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.json'))):
    if os.path.basename(f).startswith('stats-'): continue
    r = json.load(open(f))
    s = json.load(open(f.replace(os.path.basename(f), 'stats-' + os.path.basename(f))))
    acc = r.get('draft_acceptance')
    print(f"{os.path.basename(f)[:-5]} | {r['decode_tok_s_mean']:.1f} | {r.get('decode_tok_s_p50', 0):.1f} | "
          f"{'' if acc is None else f'{acc:.0%}'} | {s.get('draft_tokens', 0)}")
PY
