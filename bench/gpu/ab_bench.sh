#!/usr/bin/env bash
# On the GPU machine: an A/B of builds and environment switches on one shape, in one call,
# the variants alternating round by round on the same weights: each through the cluster
# (cluster_full_bench.sh, concurrency 1, 128 in / 512 out, 3 runs) and in process
# (decode_bench, 128 in / 256 out, 2 runs). A variant is NAME=DIR[,VAR=VALUE...]: DIR a folder
# of binaries (bench/gpu/pack_variant.sh, or .device-ipc/bin), the assignments its environment.
# Libraries in .device-ipc/lib. OUT_DIR gets results.tgz (every JSON and log: a call returns
# few files) and a table of decode tok/s, printed last.
#   bash bench/gpu/ab_bench.sh OUT_DIR SHAPE WEIGHTS ROUNDS VARIANT...
#   e.g. ... $OUT qwen3-30b-a3b fp8 2 base=.device-ipc/base new=.device-ipc/bin \
#            new-off=.device-ipc/bin,STRATA_L2_PREFETCH=0
set -uo pipefail
final=$1 shape=$2 weights=$3 rounds=$4
shift 4
root=$PWD
work=/tmp/ab-work
rm -rf "$work" && mkdir -p "$work" "$final"
export LD_LIBRARY_PATH=$root/.device-ipc/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
table=$final/table.txt
echo "variant | round | cluster decode tok/s | in process decode tok/s" >"$table"
mean() { grep -ho '"decode_tok_s_mean": *[0-9.]*' "$@" 2>/dev/null | head -1 | grep -o '[0-9.]*$'; }
for round in $(seq 1 "$rounds"); do
  for variant in "$@"; do
    name=${variant%%=*} spec=${variant#*=}
    dir=${spec%%,*} assignments=()
    [[ $spec == *,* ]] && IFS=, read -r -a assignments <<<"${spec#*,}"
    [[ $dir == /* ]] || dir=$root/$dir
    out=$work/$name-$round
    env "${assignments[@]}" BIN_DIR="$dir" bash "$root/bench/gpu/cluster_full_bench.sh" "$out" \
      "cluster:$shape:$weights:1:1" 3 >"$out.log" 2>&1
    # The weights cluster_full_bench made (bf16 checkpoint; FP8 is quantized at load).
    model=$(ls -d /dev/shm/$shape /tmp/$shape 2>/dev/null | head -1)
    env "${assignments[@]}" timeout 300 "$dir/decode_bench" --model "$model" --model-name "$shape" \
      --weights "$weights" --runs 2 --output-len 256 --machine "NVIDIA H200 (1 GPU)" \
      --out "$out/inprocess-$shape-$weights.json" >"$out/inprocess.log" 2>&1
    echo "$name | $round | $(mean "$out"/strata-*-cluster*.json) | $(mean "$out/inprocess-$shape-$weights.json")" |
      tee -a "$table"
  done
done
tar czf "$final/results.tgz" -C "$work" .
cat "$table"
