#!/usr/bin/env bash
# Builds bench/gpu/kernel_bench.cu and bench/gpu/l2_prefetch_bench.cu with the kernels they time:
# OUT (default .device/bin/kernel_bench) and l2_prefetch_bench beside it; needs nvcc, no GPU.
# Static cudart: they run on the GPU machine as they are.
set -euo pipefail
out=${1:-.device/bin/kernel_bench}
mkdir -p "$(dirname "$out")"
k=common/backend/cuda
nvcc=(/usr/local/cuda/bin/nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -I.)
"${nvcc[@]}" bench/gpu/kernel_bench.cu $k/gemv_kernels.cu $k/grouped_expert_kernels.cu \
  $k/grouped_expert_mma_kernels.cu $k/moe_gate_kernels.cu $k/paged_attention_kernels.cu \
  $k/rope_kernels.cu $k/paged_kv_kernels.cu $k/pdl.cc -o "$out"
"${nvcc[@]}" bench/gpu/l2_prefetch_bench.cu $k/gemv_kernels.cu $k/grouped_expert_kernels.cu \
  $k/grouped_expert_mma_kernels.cu $k/pdl.cc -o "$(dirname "$out")/l2_prefetch_bench"
