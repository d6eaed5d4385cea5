#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/paged_kv_kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 128;

// One block per token; threads copy the key row then the value row, 16 bytes at a time when
// the rows allow it.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    PagedKvAppendKernel(const bf16* __restrict__ k, int64_t k_stride, const bf16* __restrict__ v,
                        int64_t v_stride, TokenBatch tokens, PagedKvLayer kv) {
  const int64_t t = blockIdx.x;
  const int64_t pos = tokens.pos[t];
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kv.head_dim;
  const int32_t block =
      kv.block_tables[int64_t{tokens.seq[t]} * kv.max_blocks_per_seq + pos / kv.block_size];
  const int64_t slot = pos % kv.block_size;
  bf16* k_dst = kv.data + PagedKvOffset(block, 0, slot, kv.block_size, kv_dim);
  bf16* v_dst = kv.data + PagedKvOffset(block, 1, slot, kv.block_size, kv_dim);
  const bf16* k_src = k + t * k_stride;
  const bf16* v_src = v + t * v_stride;
  if constexpr (kVec) {
    const int64_t chunks = kv_dim / 8;
    for (int64_t c = threadIdx.x; c < 2 * chunks; c += kThreads) {
      if (c < chunks) {
        reinterpret_cast<uint4*>(k_dst)[c] = __ldg(reinterpret_cast<const uint4*>(k_src) + c);
      } else {
        reinterpret_cast<uint4*>(v_dst)[c - chunks] =
            __ldg(reinterpret_cast<const uint4*>(v_src) + c - chunks);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < 2 * kv_dim; i += kThreads) {
      if (i < kv_dim) {
        k_dst[i] = k_src[i];
      } else {
        v_dst[i - kv_dim] = v_src[i - kv_dim];
      }
    }
  }
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t LaunchPagedKvAppend(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride,
                                const TokenBatch& tokens, const PagedKvLayer& kv,
                                cudaStream_t stream) {
  if (tokens.n < 0 || tokens.n > 0x7fffffff || kv.block_size <= 0 || kv.num_kv_heads <= 0 ||
      kv.head_dim <= 0 || kv.max_blocks_per_seq <= 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens.n == 0) return cudaSuccess;
  const int64_t kv_dim = int64_t{kv.num_kv_heads} * kv.head_dim;
  const bool vec = kv_dim % 8 == 0 && k_stride % 8 == 0 && v_stride % 8 == 0 && Aligned(k) &&
                   Aligned(v) && Aligned(kv.data);
  const unsigned blocks = static_cast<unsigned>(tokens.n);
  if (vec) {
    PagedKvAppendKernel<true>
        <<<blocks, kThreads, 0, stream>>>(k, k_stride, v, v_stride, tokens, kv);
  } else {
    PagedKvAppendKernel<false>
        <<<blocks, kThreads, 0, stream>>>(k, k_stride, v, v_stride, tokens, kv);
  }
  return cudaGetLastError();
}

}  // namespace strata::gpu
