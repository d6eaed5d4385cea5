#!/usr/bin/env bash
# On the GPU machine: whole benchmark shapes through the GPU cluster (strata-expert-store, strata-router
# on cuda:0, workers on GPUs, CUDA IPC, MPS, decode steps by CUDA graph replay on both sides),
# `strata bench` 128 in / 512 out, and the transformers peer on the same weights in the same
# call. Stages, comma-separated, each "what:shape:weights:workers:concurrency" or "peer:shape";
# concurrencies separated by "/", a shape may end in @LAYERS for a cut of its first layers:
#   cluster:qwen3-30b-a3b:bf16:1:1/8/32   cluster:qwen3-30b-a3b@16:bf16:1:1   peer:qwen3-30b-a3b
# "inprocess:shape:weights" runs decode_bench (the same model in one process, graphs) and
# "stamps:shape:weights:1:1" one cluster run with GPU clock stamps on, split by
# bench/gpu/stamps_report.py (stamps-TAG.txt/json; the stamps slow it, so its figure is not one).
# The weights go to /dev/shm when it holds them and the expert store (about twice the
# checkpoint), else to /tmp. Binaries in .device-ipc/bin, libraries in .device-ipc/lib,
# hf-peer-bench.py in .device-ipc/. OUT_DIR gets the bench JSON files (as soon as each is
# written), logs.tgz and a summary; a table is printed last.
# CHECKPOINT_DTYPE=fp8 in the environment makes the checkpoints with FP8 experts (make-model
# --dtype fp8, half the bytes) and EXPERT_STORE=in-place has strata-expert-store map them where they
# are: the whole seed-125b on the two-GPU machine needs both. KV_CACHE_MB sets the router's KV
# pool (4096 MiB by default: 32 requests of 640 tokens need about 2 GiB for qwen3 in bf16).
# UP_ARGS adds flags to `strata up` (e.g. UP_ARGS=--overlap-steps=false), recorded with the
# figures as the switches are.
#   bash bench/gpu/cluster_full_bench.sh OUT_DIR STAGES [RUNS]
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -uo pipefail
final=$1 stages=$2 runs=${3:-3}
checkpoint_dtype=${CHECKPOINT_DTYPE:-bf16} expert_store=${EXPERT_STORE:-copy}
mkdir -p "$final"
out=/tmp/full-work
mkdir -p $out
root=$PWD
export LD_LIBRARY_PATH=$root/.device-ipc/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0
B=${BIN_DIR:-$root/.device-ipc/bin}  # BIN_DIR: another build's binaries (an A/B)
gpus=$(nvidia-smi -L | wc -l)
sum=$final/summary.txt
start=$SECONDS
machine="$(machine_name "$gpus")"
# The switches an A/B run sets in the environment, recorded with each figure.
env_note=$(env | grep -E '^(STRATA_[A-Z0-9_]+|CHECKPOINT_DTYPE|EXPERT_STORE|UP_ARGS)=' | sort | tr '\n' ' ' | sed 's/ $//')
read -r -a up_args <<<"${UP_ARGS:-}"

model_dir() {  # shape[@layers] -> directory with the weights (made once per machine)
  local shape=$1 dir layers=()
  [ "$checkpoint_dtype" = bf16 ] || shape=$shape-$checkpoint_dtype
  for dir in /dev/shm/$shape /tmp/$shape; do
    [ -f $dir/config.json ] && { echo $dir; return; }
  done
  dir=/tmp/$shape
  [ "$(df --output=avail -B1G /dev/shm | tail -1)" -ge 140 ] && dir=/dev/shm/$shape
  local base=${shape%-$checkpoint_dtype}
  [[ $base == *@* ]] && layers=(--layers "${base#*@}")
  "$B/strata" make-model --shape "${base%@*}" "${layers[@]}" --dtype "$checkpoint_dtype" --out $dir --threads 16 \
    >>"$out/make-$shape.log" 2>&1
  echo $dir
}

UP_WAIT_S=300 source "$root/bench/gpu/cluster_lib.sh"

for stage in ${stages//,/ }; do
  IFS=: read -r what shape weights workers conc <<<"$stage"
  conc=${conc//\//,}
  t0=$SECONDS
  if [ "$what" = peer ]; then
    # transformers reads bf16 checkpoints: the peer always gets one (and only that one).
    dir=$(checkpoint_dtype=bf16 model_dir $shape)
    timeout 420 python3 "$root/.device-ipc/hf-peer-bench.py" --model $dir --shape $shape \
      --runs $runs --out "$final/transformers-$shape-bf16.json" >"$out/peer-$shape.log" 2>&1
    note "peer $shape: exit $? in $((SECONDS - t0)) s"
    tail -2 "$out/peer-$shape.log" | tee -a "$sum"
    continue
  fi
  dir=$(model_dir $shape)
  note "$shape in $dir ($(du -sh $dir | cut -f1)) after $((SECONDS - start)) s"
  tag=$shape; [[ $shape == *@* ]] && tag="${shape%@*}-${shape#*@}L"
  model_name=$tag  # the shape name the JSON records; the file name also tells the checkpoint
  [ "$checkpoint_dtype" = bf16 ] || tag=$tag-$checkpoint_dtype-checkpoint
  if [ "$what" = inprocess ]; then
    timeout 300 "$B/decode_bench" --model $dir --model-name $model_name --weights $weights --runs $runs \
      --machine "$machine" --out "$final/inprocess-$tag-$weights.json" >"$out/inprocess-$tag.txt" 2>&1
    note "in process $tag $weights: exit $? in $((SECONDS - t0)) s"
    tail -1 "$out/inprocess-$tag.txt" | tee -a "$sum"
    continue
  fi
  name=$tag-$weights-${workers}w
  stamps=""
  if [ "$what" = stamps ]; then
    stamps=$out/stamps-$tag && name=$name-stamps && rm -rf $stamps && mkdir -p $stamps
  fi
  STRATA_GPU_CLOCK_STAMPS=$stamps up $name --model $dir --workers $workers --device cuda --weights $weights --threads 8 \
    --max-batch-tokens 512 --kv-cache-mb "${KV_CACHE_MB:-4096}" --expert-store "$expert_store" \
    "${up_args[@]}"
  if [ -n "$addr" ]; then
    note "$name: READY in $((SECONDS - t0)) s"
    suffix=""; [ "$workers" -gt 1 ] && suffix="-${workers}gpu"
    timeout 400 "$B/strata" bench --server "$addr" --model $dir --model-name $model_name \
      --input-len 128 --output-len 512 --runs $runs --concurrency $conc --weights $weights \
      --mode cluster --gpus $workers --machine "$machine" --note "$env_note" \
      --out "$final/${stamps:+stamps-}strata-$tag-$weights-cluster$suffix.json" \
      >"$out/bench-$name.txt" 2>&1
    note "$name bench: exit $? after $((SECONDS - t0)) s"
    grep -E "^\| *[0-9]" "$out/bench-$name.txt" | tee -a "$sum"
    "$B/strata" stats --server "$addr" >"$out/stats-$name.json" 2>>"$out/stats-$name.err"
    grep -o '"steps":"[0-9]*"\|"graph_steps":"[0-9]*"\|"graph_overlapped_steps":"[0-9]*"\|"graph_[a-z]*_us":[0-9.]*' "$out/stats-$name.json" | tr '\n' ' ' | tee -a "$sum"; echo | tee -a "$sum"
  fi
  down $name
  if [ -n "$stamps" ]; then
    python3 "$root/bench/gpu/stamps_report.py" $stamps --json "$final/stamps-$tag.json" 2>&1 |
      tee "$final/stamps-$tag.txt" | tee -a "$sum"
  fi
done
tar czf "$final/logs.tgz" -C "$out" . 2>/dev/null
results_table "$final"
cat "$sum"
echo "total $((SECONDS - start)) s"
