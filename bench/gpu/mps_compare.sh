#!/usr/bin/env bash
# On the GPU machine: the GPU cluster (router and one worker sharing GPU 0, CUDA IPC) with and
# without the CUDA MPS daemon, on a 16-layer cut of qwen3-30b-a3b: `strata bench` batch 1 and
# concurrency 8 (128 in / 256 out, 2 runs), and decode_bench in process on the same weights.
# Binaries in .device/bin, libraries in .device/lib. Writes bench JSON to $OUT.
#   bash bench/gpu/mps_compare.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -u
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
B=.device/bin
M=/dev/shm/q16
$B/strata make-model --shape qwen3-30b-a3b --layers 16 --out $M --threads 16 | tail -1
bench() {  # mode
  $B/strata up --model $M --workers 1 --device cuda --threads 8 > $OUT/up-$1.out 2> $OUT/up-$1.log &
  local up=$!
  for i in $(seq 1 300); do grep -q READY $OUT/up-$1.out && break; sleep 0.5; done
  local addr=$(awk '/READY/{print $2}' $OUT/up-$1.out)
  [ -z "$addr" ] && { echo "$1: no READY"; tail -3 $OUT/up-$1.log; kill $up; return; }
  $B/strata bench --server $addr --input-len 128 --output-len 256 --runs 2 --warmup 1 \
    --concurrency 1,8 --model-name qwen3-30b-a3b-16L --weights bf16 --gpus 1 \
    --machine "$(machine_name 1)" --out $OUT/cluster-$1.json 2>&1 | tail -4
  kill -TERM $up; wait $up
}
echo "== without MPS"; bench nomps
nvidia-cuda-mps-control -d && sleep 1
echo "== with MPS"; bench mps
echo quit | nvidia-cuda-mps-control
$B/decode_bench --model $M --model-name qwen3-30b-a3b-16L --weights bf16 --runs 2 --output-len 256 \
  --machine "$(machine_name 1)" --out $OUT/in-process.json 2>/dev/null | tail -1
rm -rf $M
