#!/usr/bin/env bash
# Builds bench/gpu/kernel_bench.cu and bench/gpu/l2_prefetch_bench.cu with the kernels they time
# (CMake targets of the build in BUILD_DIR, default build/) and copies them to OUT (default
# .device/bin/kernel_bench) and l2_prefetch_bench beside it; needs nvcc, no GPU.
set -euo pipefail
out=${1:-.device/bin/kernel_bench}
build=${BUILD_DIR:-build}
mkdir -p "$(dirname "$out")"
cmake --build "$build" --target kernel_bench l2_prefetch_bench
cp "$build/bin/kernel_bench" "$out"
cp "$build/bin/l2_prefetch_bench" "$(dirname "$out")/l2_prefetch_bench"
