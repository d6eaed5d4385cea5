#!/usr/bin/env bash
# On the GPU machine: an A/B of builds and environment switches on one shape, in one call,
# the variants alternating round by round on the same weights: each through the cluster
# (concurrency 1) and in process, by cluster_full_bench.sh (128 in / 512 out, 3 runs). A variant
# is NAME=DIR[,VAR=VALUE...]: DIR a folder of binaries (bench/gpu/pack_variant.sh, or
# .device-ipc/bin), the assignments its environment (CHECKPOINT_DTYPE too). Libraries in
# .device-ipc/lib. OUT_DIR gets results.tgz (every JSON and log, rewritten after each variant:
# a call returns few files, and one cut short keeps what ran) and a table of decode tok/s,
# printed last. MODES=cluster (or inprocess) in the environment runs only that one.
#   bash bench/gpu/ab_bench.sh OUT_DIR SHAPE WEIGHTS ROUNDS VARIANT...
#   e.g. ... $OUT qwen3-30b-a3b fp8 2 base=.device-ipc/base new=.device-ipc/bin \
#            new-off=.device-ipc/bin,STRATA_L2_PREFETCH=0
set -uo pipefail
final=$1 shape=$2 weights=$3 rounds=$4
shift 4
stages=()
[[ ${MODES:-cluster,inprocess} == *cluster* ]] && stages+=("cluster:$shape:$weights:1:1")
[[ ${MODES:-cluster,inprocess} == *inprocess* ]] && stages+=("inprocess:$shape:$weights")
stages=$(IFS=,; echo "${stages[*]}")
root=$PWD
work=/tmp/ab-work
rm -rf "$work" && mkdir -p "$work" "$final"
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
      "$stages" 3 >"$out.log" 2>&1
    echo "$name | $round | $(mean "$out"/strata-*-cluster*.json) | $(mean "$out"/inprocess-*.json)" |
      tee -a "$table"
    tar czf "$final/results.tgz" -C "$work" .
  done
done
cat "$table"
