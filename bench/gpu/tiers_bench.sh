#!/usr/bin/env bash
# On the GPU machine: a cluster (strata-expert-store + router + one GPU worker) on an 8-layer cut of
# the qwen3-30b-a3b shape (Zipf-skewed random routing), with every expert resident and with a
# GPU memory budget that holds about half of them, at two hot ratios. For each: `strata bench`
# (batch 1, 128 in / 256 out) and the worker's tier counters. The hot set is re-picked from
# the uses seen in a warm-up (no calibration plan for random weights).
# Expects strata binaries in .device/bin and their libraries in .device/lib.
#   bash bench/gpu/tiers_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -u
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
B=.device/bin
M=/dev/shm/q8
$B/strata make-model --shape qwen3-30b-a3b --layers 8 --skew zipf:1.0 --out $M --threads 16 | tail -1
du -sh $M
run() {  # name, extra up flags..., then hot ratio to set after warm-up (or "-")
  local name=$1 ratio=$2; shift 2
  $B/strata up --model $M --workers 1 --device cuda --threads 8 --max-batch-tokens 256 "$@" \
    > $OUT/up-$name.out 2> $OUT/up-$name.log &
  local up=$!
  for i in $(seq 1 300); do grep -q READY $OUT/up-$name.out && break; sleep 1; done
  local addr=$(awk '/READY/{print $2}' $OUT/up-$name.out)
  if [ -z "$addr" ]; then echo "$name: no READY"; tail -5 $OUT/up-$name.log; kill $up; return; fi
  $B/strata bench --server $addr --input-len 128 --output-len 64 --runs 1 --warmup 0 --seed 7919 > /dev/null 2>&1
  [ "$ratio" != "-" ] && $B/strata hot-ratio --server $addr --hot-ratio $ratio
  $B/strata bench --server $addr --input-len 128 --output-len 256 --runs 3 --warmup 1 \
    --model-name qwen3-30b-a3b-8layers --weights bf16 --gpus 1 --machine "$(machine_name 1)" \
    --out $OUT/tiers-$name.json 2>&1 | tail -3
  $B/strata stats --server $addr > $OUT/stats-$name.json
  kill -TERM $up; wait $up
}
run all - 
run budget-h02 0.2 --gpu-memory-budget 6GiB --hot-ratio 0.2
run budget-h05 0.5 --gpu-memory-budget 6GiB --hot-ratio 0.5
python3 - <<'PY'
import json, os
out = os.environ['OUT']
print('run | decode tok/s | hot | warm | miss | prefetch hits/loads | GiB copied | prefetch acc')
for name in ['all', 'budget-h02', 'budget-h05']:
    try:
        b = json.load(open(f'{out}/tiers-{name}.json')); s = json.load(open(f'{out}/stats-{name}.json'))
    except Exception as e:
        print(name, 'missing', e); continue
    r = b['results'][0] if 'results' in b else b
    t = {k: int(v) for k, v in s['workers'][0]['tiers'].items()}
    u = max(t['hot_hits'] + t['warm_hits'] + t['misses'], 1)
    acc = int(s['prefetch_correct']) / max(int(s['prefetch_actual']), 1)
    print(f"{name} | {r.get('decode_tok_s_mean')} | {t['hot_hits']/u:.3f} ({t['hot_slots']}) | "
          f"{t['warm_hits']/u:.3f} ({t['warm_slots']}) | {t['misses']/u:.3f} | "
          f"{t['prefetch_hits']}/{t['prefetch_loads']} | {t['bytes_copied']/2**30:.1f} | {acc:.3f}")
PY
