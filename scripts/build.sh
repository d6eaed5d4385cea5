#!/usr/bin/env bash
# Configures and builds into build/ (binaries in build/bin/). Extra arguments go to cmake.
# The CUDA backend is built when nvcc is found (/usr/local/cuda/bin/nvcc or on PATH).
# JOBS: parallel jobs (default: every CPU). STRATA_TARGETS: build only these targets
# (space-separated, e.g. "strata strata-router"); default: everything.
# xgrammar's source (structured output) is fetched first when it is not there
# (scripts/fetch_xgrammar.sh); without it the build goes on and refuses response formats.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! scripts/fetch_xgrammar.sh; then
  echo "build: could not fetch xgrammar; structured output (response_format) will be refused" >&2
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
targets=()
for target in ${STRATA_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build build --parallel "${JOBS:-$(nproc)}" "${targets[@]}"
