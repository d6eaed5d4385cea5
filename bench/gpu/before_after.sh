#!/usr/bin/env bash
# On the GPU machine: batch-1 decode of the qwen3-30b-a3b shape cut to LAYERS layers, with the
# flags of in_process_bench.sh (128 in, 512 out, 5 runs after 1 warm-up), for each folder of
# binaries given (e.g. .device/base before a change, .device/bin after), bf16 then FP8 experts,
# the folders interleaved. JSON records in OUT_DIR as strata-SHAPE-LAYERSL-TAG-WEIGHTS.json.
#   bench/gpu/before_after.sh OUT_DIR LAYERS DIR...
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -uo pipefail
out=$1 layers=$2
shift 2
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
model=/tmp/qwen3-30b-a3b-$layers
name=qwen3-30b-a3b-${layers}L
[ -d "$model" ] || python3 bench/gpu/make_hf_model.py --shape qwen3-30b-a3b --layers "$layers" \
  --out "$model" 2>&1 | tail -1
for w in bf16 fp8; do
  for dir in "$@"; do
    tag=$(basename "$dir")
    "$dir/decode_bench" --model "$model" --model-name "$name" --weights "$w" --runs 5 \
      --machine "$(machine_name 1)" --out "$out/strata-$name-$tag-$w.json" \
      2>"$out/decode-$name-$tag-$w.log" | tail -1 | sed "s/^/$tag: /"
  done
done
