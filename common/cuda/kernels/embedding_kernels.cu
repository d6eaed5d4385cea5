#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/embedding_kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

// One block per token; 16-byte copies when rows allow, else element by element.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    EmbeddingGatherKernel(const bf16* __restrict__ table, int64_t vocab, int64_t hidden,
                          const int32_t* __restrict__ ids, const int32_t* __restrict__ fallback_ids,
                          bf16* __restrict__ out) {
  const int64_t t = blockIdx.x;
  int32_t id = ids[t];
  if (id < 0 && fallback_ids != nullptr) id = fallback_ids[t];
  const bool valid = id >= 0 && id < vocab;
  const bf16* src = table + (valid ? id : 0) * hidden;
  bf16* dst = out + t * hidden;
  if constexpr (kVec) {
    const int64_t chunks = hidden / 8;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
      d[c] = valid ? __ldg(s + c) : make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
      dst[i] = valid ? src[i] : __float2bfloat16(0.0f);
    }
  }
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const bf16* table, int64_t vocab, int64_t hidden,
                                  const int32_t* ids, int64_t n, bf16* out, cudaStream_t stream,
                                  const int32_t* fallback_ids) {
  if (n < 0 || hidden <= 0 || vocab <= 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool vec = hidden % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    EmbeddingGatherKernel<true>
        <<<n, kThreads, 0, stream>>>(table, vocab, hidden, ids, fallback_ids, out);
  } else {
    EmbeddingGatherKernel<false>
        <<<n, kThreads, 0, stream>>>(table, vocab, hidden, ids, fallback_ids, out);
  }
  return cudaGetLastError();
}

}  // namespace strata::gpu
