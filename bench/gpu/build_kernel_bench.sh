#!/usr/bin/env bash
# Builds bench/gpu/kernel_bench.cu with the kernels it times into OUT (default
# .device/bin/kernel_bench); needs nvcc, no GPU. Static cudart: runs on the GPU machine as is.
set -euo pipefail
out=${1:-.device/bin/kernel_bench}
mkdir -p "$(dirname "$out")"
k=common/backend/cuda
/usr/local/cuda/bin/nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -I. \
  bench/gpu/kernel_bench.cu $k/gemv_kernels.cu $k/grouped_expert_kernels.cu \
  $k/grouped_expert_mma_kernels.cu $k/moe_gate_kernels.cu $k/paged_attention_kernels.cu \
  $k/rope_kernels.cu $k/paged_kv_kernels.cu $k/pdl.cc -o "$out"
