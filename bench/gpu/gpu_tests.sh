#!/usr/bin/env bash
# On the GPU machine: the CUDA test binaries (ops against the CPU backend, engine, demo model,
# cluster with a worker per GPU present) from .device-ipc/bin, once per environment
# given (e.g. "STRATA_MMA_EXPERTS=0" "STRATA_MMA_EXPERTS=1", or "STRATA_FLAG_WAIT=memop" "STRATA_FLAG_WAIT=poll";
# the cluster test runs under MPS, where flag waits poll unless STRATA_FLAG_WAIT=memop).
# Logs go to OUT_DIR; a summary is printed last.
#   bash bench/gpu/gpu_tests.sh OUT_DIR [ENV_ASSIGNMENT...]
set -uo pipefail
out=$1; shift
envs=("$@"); [ ${#envs[@]} -eq 0 ] && envs=("STRATA_MMA_EXPERTS=1")
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.device-ipc/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
# The cluster test starts the built binaries by their path in the source tree.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
mkdir -p build/bin && cp -f .device-ipc/bin/* build/bin/
start=$SECONDS
for assignment in "${envs[@]}"; do
  tag=${assignment//[^A-Za-z0-9]/_}
  # Limits about ten times each binary's usual run (7, 1, 3, 11 s on the H200), so that a hang
  # costs little device time.
  for t in cuda_ops_test:90 cuda_expert_slots_test:60 cuda_tiered_slots_test:60 \
           cuda_ipc_test:60 cuda_engine_test:60 cuda_demo_model_test:60 cuda_cluster_test:240 \
           cuda_tiers_test:240; do
    limit=${t#*:} t=${t%:*}
    log=$out/$t-$tag.log
    env "$assignment" timeout "$limit" build/bin/$t >"$log" 2>&1
    echo "$assignment $t exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' ')) \
after $((SECONDS - start)) s" | tee -a "$out/summary.txt"
    grep -E "^\[  FAILED|Failure" "$log" | head -10 | tee -a "$out/summary.txt"
  done
done
