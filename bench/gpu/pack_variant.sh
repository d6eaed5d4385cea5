#!/usr/bin/env bash
# Packs the binaries an A/B of builds swaps (strata, strata-router, strata-worker,
# strata-expert-store, decode_bench; stripped, about 4 MB) from BUILD_DIR into .device-ipc/NAME.tar.xz,
# for bench/gpu/ab_bench.sh. The libraries come with pack_device.sh's bundle (build both
# variants with the same dependencies). On the GPU machine:
#   tar xJf .device-ipc/NAME.tar.xz -C .device-ipc      (gives .device-ipc/NAME/)
#   bash bench/gpu/pack_variant.sh BUILD_DIR NAME
set -euo pipefail
build=$1 name=$2
stage=$(mktemp -d)
mkdir -p "$stage/$name" .device-ipc
for b in strata strata-router strata-worker strata-expert-store decode_bench; do
  cp "$build/bin/$b" "$stage/$name/"
done
strip "$stage/$name"/*
tar cJf ".device-ipc/$name.tar.xz" -C "$stage" "$name"
rm -rf "$stage"
ls -la ".device-ipc/$name.tar.xz"
