#!/usr/bin/env bash
# Builds bench/gpu/flag_pingpong.cu into OUT (default .device/bin/flag_pingpong); needs nvcc, no
# GPU. Static cudart; libcuda comes from the GPU machine's driver.
set -euo pipefail
out=${1:-.device/bin/flag_pingpong}
mkdir -p "$(dirname "$out")"
/usr/local/cuda/bin/nvcc -std=c++20 -O3 -arch=sm_90 bench/gpu/flag_pingpong.cu \
  -L/usr/local/cuda/lib64/stubs -lcuda -o "$out"
