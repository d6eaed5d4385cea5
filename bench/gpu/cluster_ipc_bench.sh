#!/usr/bin/env bash
# On the GPU machine: the cluster on GPUs (strata-router and the workers on GPUs, activations
# shared by CUDA IPC). Stages, comma-separated:
#   tests  cuda_cluster_test: greedy tokens on the head_dim 64/128 oracle models and a killed
#          worker, on one GPU (one worker), then with two GPUs on both (a worker on each)
#   bench  strata bench through the GPU cluster (one worker; with two GPUs also one per GPU) on
#          a 16-layer cut of qwen3-30b-a3b (bf16, 128 in / 512 out, 3 runs, concurrency 1 and
#          8), then decode_bench in process on the same weights: the process split's cost
#   engine cuda_engine_test (in process, bf16) on the same oracle models
#   verify cuda_cluster_test whole on every GPU (demo perplexity included), then on one GPU
#   stamps the 16-layer cut through the GPU cluster (one worker) with GPU clock stamps on, and
#          bench/gpu/stamps_report.py's split of a replayed step (stamps.txt, stamps.json)
#   ppl    held-out perplexity of models/strata-demo in process and through the GPU cluster
#          (strata eval --server), cuda_cluster_test's check of the two, cuda_demo_model_test
# Binaries in .device-ipc/bin, their libraries in .device-ipc/lib. OUT_DIR gets the summary
# (written as it goes), the bench JSON files and logs.tgz; a table is printed last.
# Packing (here): bash bench/gpu/pack_device.sh, which also says how the call carries and unpacks
# the bundle, the oracles and the demo model (models/ and tests/data/oracles/ moved aside for
# the call, to stay under 64 MiB).
#   bash bench/gpu/cluster_ipc_bench.sh OUT_DIR [tests,bench,engine,verify,ppl]
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -uo pipefail
final=$1 stages=${2:-tests,bench}
out=/tmp/ipc-work
rm -rf $out && mkdir -p $out
root=$PWD
export LD_LIBRARY_PATH=$root/.device-ipc/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0  # nothing here uses NCCL; keep multicast off regardless
# The tests look for their data, the sources and `strata` where they were built (/work/main).
if [ "$root" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$root" /work/main; fi
mkdir -p build/bin && cp -f .device-ipc/bin/* build/bin/
B=$root/build/bin
gpus=$(nvidia-smi -L | wc -l)
sum=$final/summary.txt
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$sum"
has() { [[ ",$stages," == *",$1,"* ]]; }

source "$root/bench/gpu/cluster_lib.sh"

if has tests; then
  # One GPU (one worker), then, when there are two, a worker on each.
  for n in 1 2; do
    [ "$n" -le "$gpus" ] || continue
    devices=0; [ "$n" = 2 ] && devices=0,1
    CUDA_VISIBLE_DEVICES=$devices timeout 120 "$B/cuda_cluster_test" --gtest_filter='-*Demo*' \
      >"$out/cuda_cluster_test-${n}gpu.log" 2>&1
    note "cuda_cluster_test on $n GPU: exit $?"
    grep -E "greedy tokens equal|killed worker|^\[  (PASSED|FAILED)|Failure|rror" \
      "$out/cuda_cluster_test-${n}gpu.log" | head -24 | tee -a "$sum"
  done
  note "after tests: $((SECONDS - start)) s"
fi

M=/dev/shm/q16 name=qwen3-30b-a3b-16L
if has bench || has stamps; then
  [ -f $M/config.json ] || "$B/strata" make-model --shape qwen3-30b-a3b --layers 16 --out $M \
    --threads 16 2>&1 | tail -1 | tee -a "$sum"
fi

if has stamps; then
  mkdir -p $out/stamps
  STRATA_GPU_CLOCK_STAMPS=$out/stamps up stamps --model $M --workers 1 --device cuda --threads 8 \
    --max-batch-tokens 512
  if [ -n "$addr" ]; then
    timeout 60 "$B/strata" bench --server "$addr" --model $M --model-name $name --input-len 128 \
      --output-len 512 --runs 2 --concurrency 1 --out "$out/stamps-bench.json" \
      >"$out/bench-stamps.txt" 2>&1
    note "stamps bench: exit $?"
    tail -3 "$out/bench-stamps.txt" | tee -a "$sum"
  fi
  down stamps
  python3 "$root/bench/gpu/stamps_report.py" $out/stamps --json "$final/stamps.json" 2>&1 |
    tee "$final/stamps.txt" | tee -a "$sum"
fi

if has bench; then
  bench() {  # tag workers gpus
    local tag=$1 w=$2 g=$3
    up "$tag" --model $M --workers "$w" --device cuda --threads 8 --max-batch-tokens 512
    [ -n "$addr" ] || { down "$tag"; return; }
    note "$tag: READY after $((SECONDS - start)) s"
    timeout 120 "$B/strata" bench --server "$addr" --model $M --model-name $name \
      --input-len 128 --output-len 512 --runs 3 --concurrency 1,8 --weights bf16 \
      --mode cluster --gpus "$g" --machine "$(machine_name "$g")" \
      --out "$out/strata-$name-bf16-cluster$4.json" >"$out/bench-$tag.txt" 2>&1
    note "$tag bench: exit $?"
    "$B/strata" stats --server "$addr" >"$out/stats-$tag.json" 2>>"$out/stats-$tag.err"
    down "$tag"
  }
  bench cluster-1w 1 1 ""
  timeout 60 "$B/decode_bench" --model $M --model-name $name --weights bf16 --runs 3 \
    --machine "$(machine_name 1)" --out "$out/inprocess-$name-bf16-graphs.json" \
    >"$out/decode_bench.txt" 2>&1
  note "decode_bench: exit $?"
  if [ "$gpus" -ge 2 ] && (( SECONDS - start < 150 )); then bench cluster-2w 2 2 "-2gpu"; fi
  note "after bench: $((SECONDS - start)) s"
fi

if has engine && (( SECONDS - start < 190 )); then
  timeout 60 "$B/cuda_engine_test" --gtest_filter='*hd64_bf16:*hd128_bf16' \
    >"$out/cuda_engine_test.log" 2>&1
  note "cuda_engine_test (hd64/hd128, bf16): exit $?"
  grep -E "argmax|^\[  (PASSED|FAILED)" "$out/cuda_engine_test.log" | tee -a "$sum"
  if [ -d "$root/models/strata-demo" ]; then
    timeout 60 "$B/cuda_demo_model_test" --gtest_filter='*Graph*' >"$out/cuda_demo_graph.log" 2>&1
    note "cuda_demo_model_test (graph replay = eager): exit $?"
    grep -E "^\[  (PASSED|FAILED)|Failure" "$out/cuda_demo_graph.log" | tee -a "$sum"
  fi
fi

if has verify; then
  timeout 300 "$B/cuda_cluster_test" >"$out/cuda_cluster_test-all.log" 2>&1
  note "cuda_cluster_test on $gpus GPU: exit $?"
  grep -E "argmax|perplexity|killed worker|by replay|^\[  (PASSED|FAILED)|Failure|rror" \
    "$out/cuda_cluster_test-all.log" | head -24 | tee -a "$sum"
  if [ "$gpus" -ge 2 ] && (( SECONDS - start < 60 )); then
    CUDA_VISIBLE_DEVICES=0 timeout 40 "$B/cuda_cluster_test" --gtest_filter='-*Demo*' \
      >"$out/cuda_cluster_test-1gpu.log" 2>&1
    note "cuda_cluster_test on 1 GPU: exit $?"
    grep -E "argmax|killed worker|^\[  (PASSED|FAILED)|Failure|rror" \
      "$out/cuda_cluster_test-1gpu.log" | head -16 | tee -a "$sum"
  fi
fi

if has ppl; then
  [ -x "$B/strata" ] || { note "no binaries: a fresh machine (run the tests or bench stage first)"; exit 3; }
  D=$root/models/strata-demo T=$root/tests/data/heldout/strata-demo-valid.txt
  timeout 60 "$B/strata" eval --model $D --text $T --device cuda >"$out/eval-inprocess.json" \
    2>"$out/eval-inprocess.log"
  note "eval in process: $(cat "$out/eval-inprocess.json")"
  up ppl --model $D --workers 1 --device cuda --threads 4
  if [ -n "$addr" ]; then
    timeout 90 "$B/strata" eval --model $D --text $T --server "$addr" >"$out/eval-cluster.json" \
      2>"$out/eval-cluster.log"
    note "eval through the GPU cluster: $(cat "$out/eval-cluster.json")"
  fi
  down ppl
  timeout 120 "$B/cuda_cluster_test" --gtest_filter='*Demo*' >"$out/cuda_cluster_test-demo.log" 2>&1
  note "cuda_cluster_test demo: exit $?"
  grep -E "perplexity|^\[  (PASSED|FAILED)|Failure" "$out/cuda_cluster_test-demo.log" | tee -a "$sum"
  timeout 90 "$B/cuda_demo_model_test" --gtest_filter='*bf16*:*Graph*' \
    >"$out/cuda_demo_model_test.log" 2>&1
  note "cuda_demo_model_test (bf16, graphs): exit $?"
  grep -E "perplexity|greedy tokens|^\[  (PASSED|FAILED)|Failure" \
    "$out/cuda_demo_model_test.log" | tee -a "$sum"
fi

cp "$out"/strata-*.json "$out"/inprocess-*.json "$out"/eval-*.json "$final"/ 2>/dev/null
tar czf "$final/logs.tgz" -C "$out" . 2>/dev/null

results_table "$final"
cat "$sum"
echo "total $((SECONDS - start)) s"
