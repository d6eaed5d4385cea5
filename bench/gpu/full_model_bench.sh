#!/usr/bin/env bash
# On the GPU machine: batch-1 decode of the whole qwen3-30b-a3b shape (48 layers, 61 GB of
# bf16 weights) in process, bf16 and FP8 experts. The weights go to /dev/shm (128 GB tmpfs
# there) when it has room, as the 64 GB disk cannot hold them. Writes bench/results JSON to
# $OUT. Expects decode_bench in .device/bin and its libraries in .device/lib.
#   bash bench/gpu/full_model_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
df -h /dev/shm /tmp | tail -2; free -g | head -2
free_shm=$(df --output=avail -B1G /dev/shm | tail -1); dir=/tmp/q48; [ "$free_shm" -ge 64 ] && dir=/dev/shm/q48; echo "writing to $dir"
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
# strata make-model writes the same Hugging Face files much faster than a transformers init.
if [ -x .device/bin/strata ]; then
  .device/bin/strata make-model --shape qwen3-30b-a3b --out $dir --threads 16 | tail -1
else
  python3 bench/gpu/make_hf_model.py --shape qwen3-30b-a3b --out $dir 2>&1 | tail -1
fi
du -sh $dir
for w in bf16 fp8; do .device/bin/decode_bench --model $dir --model-name qwen3-30b-a3b --weights $w --runs 3 --machine "$(machine_name 1)" --out $OUT/strata-qwen3-30b-a3b-$w-graphs.json 2>$OUT/decode-$w.log | tail -1; grep -E "loaded" $OUT/decode-$w.log; done
rm -rf $dir
