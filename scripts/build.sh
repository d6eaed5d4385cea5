#!/usr/bin/env bash
# Configures and builds into build/ (binaries in build/bin/). Extra arguments go to cmake.
# The CUDA backend is built when nvcc is found (/usr/local/cuda/bin/nvcc or on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
cmake --build build --parallel "${JOBS:-$(nproc)}"
