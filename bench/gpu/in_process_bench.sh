#!/usr/bin/env bash
# On the GPU machine: the CUDA engine test, then batch-1 decode of one benchmark shape in
# process (Strata bf16 and FP8 experts) and the transformers peer on the same weights.
#   bench/gpu/in_process_bench.sh OUT_DIR SHAPE LAYERS
# Expects the binaries in .device/bin, their libraries in .device/lib, hf-peer-bench.py in
# .device/ (see docs/archive/benchmarks-2026-11-to-12-02.md).
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -uo pipefail
out=$1 shape=$2 layers=$3
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
.device/bin/cuda_engine_test 2>&1 | tee "$out/cuda_engine_test.log" | grep -E "worst row|PASSED|FAILED|OK \]" | tail -40
model=/tmp/$shape-$layers
python3 bench/gpu/make_hf_model.py --shape "$shape" --layers "$layers" --out "$model" 2>&1 | tail -1
name="$shape-${layers}L"
for w in bf16 fp8; do
  .device/bin/decode_bench --model "$model" --model-name "$name" --weights "$w" --runs 5 \
    --machine "$(machine_name 1)" --out "$out/strata-$name-$w.json" 2>"$out/decode-$w.log" | tail -1
done
python3 .device/hf-peer-bench.py --model "$model" --shape "$name" --runs 3 \
  --out "$out/transformers-$name-bf16.json" 2>"$out/peer.log" | tail -3
