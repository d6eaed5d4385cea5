// Per-head RMSNorm of q and k (Qwen3's q_norm / k_norm, optional) followed by rotary position
// embedding in the rotate-half convention, in place.
#ifndef STRATA_COMMON_CUDA_KERNELS_ROPE_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_ROPE_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

struct QkRopeParams {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;      // even, at most 256
  int rope_dim = 0;      // the leading dimensions rotated (partial rotary); 0: all of head_dim
  int64_t q_stride = 0;  // elements between tokens' q rows (num_heads * head_dim if packed)
  int64_t k_stride = 0;  // same for k (lets q and k live inside a fused qkv buffer)
  const float* inv_freq = nullptr;  // [rope_dim / 2], device; BuildRopeTable's inv_freq
  float attention_scaling = 1.0f;   // multiplies cos and sin (YaRN mscale)
  const bf16* q_norm = nullptr;     // [head_dim] or null: no q norm
  const bf16* k_norm = nullptr;     // [head_dim] or null: no k norm
  float eps = 1e-6f;
};

// For every token t < n with position positions[t], each head of q [n, heads * d] and k
// [n, kv_heads * d] is normalized over all d (when its norm weight is given) and its first r =
// rope_dim dimensions rotated: x[j], x[j + r/2] turn by positions[t] * inv_freq[j] for j < r/2,
// scaled by attention_scaling; dimensions from r on are only normalized.
cudaError_t LaunchQkNormRope(bf16* q, bf16* k, int64_t n, const int32_t* positions,
                             const QkRopeParams& params, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_ROPE_KERNELS_H_
