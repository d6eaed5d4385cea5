#!/usr/bin/env bash
# On the GPU machine: `strata up --device cuda` as a user runs it (MPS left on auto) on a
# 16-layer cut of qwen3-30b-a3b; checks that the cluster started its MPS daemon and measures
# batch-1 decode through it. Binaries in .device/bin, libraries in .device/lib.
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
set -u
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
B=.device/bin
M=/dev/shm/q16
$B/strata make-model --shape qwen3-30b-a3b --layers 16 --out $M --threads 16 | tail -1
$B/strata up --model $M --workers 1 --device cuda --threads 8 > $OUT/up.out 2> $OUT/up.log &
up=$!
for i in $(seq 1 300); do grep -q READY $OUT/up.out && break; sleep 0.5; done
addr=$(awk '/READY/{print $2}' $OUT/up.out)
grep -E "MPS" $OUT/up.log
$B/strata bench --server $addr --input-len 128 --output-len 512 --runs 3 --warmup 1 \
  --model-name qwen3-30b-a3b-16L --weights bf16 --gpus 1 --machine "$(machine_name 1)" \
  --out $OUT/cluster-default.json 2>&1 | tail -2
kill -TERM $up; wait $up; echo "strata up exit $?"
ls /tmp | grep -c strata-mps
rm -rf $M
