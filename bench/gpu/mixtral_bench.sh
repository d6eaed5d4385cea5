#!/usr/bin/env bash
# On the GPU machine: batch-1 decode of the mixtral-8x7b shape (32 layers, 8 experts top-2,
# 46.7 B parameters, 93 GB bf16) in process, bf16 and FP8 experts, one CUDA graph per decode
# step. The weights go to /dev/shm (128 GB tmpfs there). Writes bench/results JSON to $OUT.
# Expects strata and decode_bench in .device/bin and their libraries in .device/lib.
#   bash bench/gpu/mixtral_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
M=/dev/shm/mixtral
df -h /dev/shm | tail -1
/usr/bin/time -f "make-model %e s" .device/bin/strata make-model --shape mixtral-8x7b --out $M --threads 16 | tail -1
du -sh $M
for w in bf16 fp8; do
  .device/bin/decode_bench --model $M --model-name mixtral-8x7b --weights $w --runs 3 \
    --machine "$(machine_name 1)" --out $OUT/strata-mixtral-8x7b-$w-graphs.json \
    2> $OUT/decode-mixtral-$w.log | tail -1
  grep -E "loaded" $OUT/decode-mixtral-$w.log
done
rm -rf $M
