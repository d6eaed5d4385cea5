#!/usr/bin/env bash
# On the GPU machine: clusters of GPU workers with and without a memory budget (router on
# cuda:0, CUDA IPC, MPS, decode graphs on both sides), `strata bench` (128 in / OUT_LEN out,
# batch 1 unless BENCH FLAGS say): a warm-up round, `strata stats`, RUNS measured runs, `strata
# stats` again. Decode tok/s, TTFT, hit rates per tier and bytes copied per generated token of
# the measured runs as the bench record has them; steps replayed from the two stats. One
# cluster per run, each
#   NAME|BIN_DIR|MODEL_DIR|WEIGHTS|UP FLAGS|BENCH FLAGS|ENV
# (BIN_DIR: the strata binaries to run, e.g. a base build for a before/after; UP FLAGS go to
# `strata up`, e.g. --gpu-memory-budget 24GiB --workers 2 --gpus 1; BENCH FLAGS to both `strata
# bench` runs, e.g. --temperature 1; ENV: VAR=VALUE words set for the cluster and the benches,
# e.g. STRATA_STEP_TRIALS=off, and named in the record's note). Logs and JSON go to OUT_DIR; a
# table is printed last.
#   bash bench/gpu/tiers_ipc_bench.sh OUT_DIR 'run1' 'run2' ...
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -uo pipefail
final=$1; shift
out=/tmp/tiers-work
mkdir -p "$final" $out
root=$PWD
sum=$final/summary.txt
start=$SECONDS
OUT_LEN=${OUT_LEN:-512} RUNS=${RUNS:-3}
B=$root/.device-ipc/bin  # cluster_lib's `up` runs $B/strata
UP_WAIT_S=600 source "$root/bench/gpu/cluster_lib.sh"
for spec in "$@"; do
  IFS='|' read -r name bin dir weights flags bench_flags env_words <<<"$spec"
  read -r -a env_vars <<<"${env_words:-}"
  for v in "${env_vars[@]}"; do export "${v?}"; done
  B=$root/$bin
  export LD_LIBRARY_PATH=$root/.device-ipc/lib:/usr/local/cuda/lib64
  read -r -a up_flags <<<"$flags"
  read -r -a bench_args <<<"${bench_flags:-}"
  t0=$SECONDS
  up "$name" --model "$dir" --device cuda --weights "$weights" --threads 8 \
    --max-batch-tokens 512 --kv-cache-mb 4096 "${up_flags[@]}"
  if [ -z "$addr" ]; then continue; fi
  note "$name: READY in $((SECONDS - t0)) s"
  # Its own seed (after the bench flags): the measured prompts must not be in the prefix cache.
  timeout 300 "$B/strata" bench --server "$addr" --input-len 128 --output-len "$OUT_LEN" \
    --runs 1 --warmup 0 --concurrency 1 "${bench_args[@]}" --seed 7919 >"$out/warmup-$name.txt" 2>&1
  "$B/strata" stats --server "$addr" >"$final/stats-$name-before.json" 2>>"$out/stats-$name.err"
  timeout 500 "$B/strata" bench --server "$addr" --model "$dir" --model-name "$(basename "$dir")" \
    --input-len 128 --output-len "$OUT_LEN" --runs "$RUNS" --warmup 0 --concurrency 1 "${bench_args[@]}" \
    --weights "$weights" --mode cluster --gpus 1 --machine "$(machine_name 1)" \
    --note "$name: ${env_words:+$env_words }$flags $bench_flags" --commit "$(cat "$root/$bin/../COMMIT" 2>/dev/null)" \
    --out "$final/$name.json" >"$out/bench-$name.txt" 2>&1
  note "$name bench: exit $? after $((SECONDS - t0)) s"
  "$B/strata" stats --server "$addr" >"$final/stats-$name.json" 2>>"$out/stats-$name.err"
  down "$name"
  for v in "${env_vars[@]}"; do unset "${v%%=*}"; done
done
tar czf "$final/logs.tgz" -C "$out" . 2>/dev/null
python3 - "$final" "$@" <<'PY' | tee -a "$sum"
# Tier figures as `strata bench` recorded them (from its own Stats readings around the rounds);
# the replayed steps from the two readings here.
import json, sys
final = sys.argv[1]
print('run | decode tok/s mean | P5 | P95 | TTFT ms | distinct tokens | steps replayed | hot | warm | cold | MB copied / token | CPU-tier experts / token')
for spec in sys.argv[2:]:
    name = spec.split('|')[0]
    try:
        b = json.load(open(f"{final}/{name}.json")); s = json.load(open(f"{final}/stats-{name}.json"))
        s0 = json.load(open(f'{final}/stats-{name}-before.json'))
    except Exception as e:
        print(f'{name} | missing ({e})'); continue
    r = b['results'][0] if 'results' in b else b
    t = r.get('tiers', {})
    replayed = (f"{int(s.get('graph_steps', 0)) - int(s0.get('graph_steps', 0))}/"
                f"{int(s.get('steps', 0)) - int(s0.get('steps', 0))}")
    print(f"{name} | {r['decode_tok_s_mean']:.1f} | {r['decode_tok_s_p5']:.1f} | "
          f"{r['decode_tok_s_p95']:.1f} | {r['ttft_ms']:.1f} | "
          f"{r.get('distinct_output_tokens', 0):.2f} | {replayed} | "
          f"{t.get('hot_hit_rate', 0):.3f} | {t.get('warm_hit_rate', 0):.3f} | "
          f"{t.get('miss_rate', 0):.3f} | {t.get('bytes_copied_per_token', 0) / 1e6:.1f} | "
          f"{t.get('cpu_tier_experts_per_token', 0):.1f}")
PY
cat "$sum"
echo "total $((SECONDS - start)) s"
