#!/usr/bin/env bash
# Packs what a GPU-machine call needs from this machine's CUDA build, under the device tool's
# 64 MiB limit: .device-ipc/bundle.tar.xz (the cluster's binaries, the GPU tests, decode_bench,
# flag_pingpong, hf-peer-bench.py and the shared libraries the GPU machine lacks),
# .device-ipc/oracles.tar.xz (the head_dim 64/128 oracle models the GPU tests use) and
# .device-demo/demo.tar.xz (models/strata-demo). Both folders belong in .git/info/exclude.
# The call then carries the three files, with models/ and tests/data/oracles/ moved aside for
# it, and unpacks them first:
#   mkdir -p .device-ipc && tar xJf .device-ipc/bundle.tar.xz -C .device-ipc &&
#   tar xJf .device-ipc/oracles.tar.xz && tar xJf .device-demo/demo.tar.xz && bash bench/gpu/...
#   bash bench/gpu/pack_device.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
stage=$(mktemp -d)
mkdir -p "$stage/bin" .device-ipc .device-demo
# BINS overrides the list (e.g. to add decode_bench or kernel_bench when the call has room).
for b in ${BINS:-strata strata-router strata-worker strata-expert-store cuda_cluster_test cuda_engine_test \
         cuda_demo_model_test cuda_ops_test cuda_ipc_test cuda_expert_slots_test \
         cuda_tiered_slots_test cuda_tiers_test}; do
  cp "$build/bin/$b" "$stage/bin/"
done
strip "$stage/bin"/*
../shared/tools/device-bundle.sh "$stage/lib" "$stage/bin"/* | tail -1
# Static cudart and the driver's libcuda: nothing to bundle for it.
bash bench/gpu/build_flag_pingpong.sh "$stage/bin/flag_pingpong"
cp ../shared/tools/hf-peer-bench.py "$stage/"
# The commit the binaries were built from ("-dirty": with uncommitted changes), for the records.
{ git rev-parse --short HEAD | tr -d '\n'; git diff --quiet HEAD -- common services tools proto || echo -n -dirty; echo; } >"$stage/COMMIT"
# xz -9e: its larger window finds the libraries' repeats, about 30% smaller than tar's -J.
tar cf - -C "$stage" bin lib hf-peer-bench.py COMMIT | xz -9e -T0 >.device-ipc/bundle.tar.xz
# The oracles the GPU attention takes (head_dim 64 and 128; any with latent attention).
[ -f .device-ipc/oracles.tar.xz ] || tar cJf .device-ipc/oracles.tar.xz \
  tests/data/oracles/{qwen3_moe_hd64,mixtral_hd128,qwen2_moe_hd64,gpt_oss_hd64,deepseek_v3}
[ -f .device-demo/demo.tar.xz ] || tar cJf .device-demo/demo.tar.xz models/strata-demo
rm -rf "$stage"
ls -la .device-ipc/*.tar.xz .device-demo/*.tar.xz
