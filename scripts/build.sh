#!/usr/bin/env bash
# Configures and builds into build/ (binaries in build/bin/). Extra arguments go to cmake.
# The CUDA backend is built when nvcc is found (/usr/local/cuda/bin/nvcc or on PATH).
# JOBS: parallel jobs (default: every CPU). STRATA_TARGETS: build only these targets
# (space-separated, e.g. "strata strata-router"); default: everything.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
targets=()
for target in ${STRATA_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build build --parallel "${JOBS:-$(nproc)}" "${targets[@]}"
