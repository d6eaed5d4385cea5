// Multi-head latent attention (DeepSeek-V3, Kimi-K2) on the device, in the absorbed form the
// CPU backend computes (common/backend/cpu/cpu_latent_attention.cc): the cache keeps one row a
// token and layer, [normalized latent (rank) ; rotated k_pe (rope)], which serves as key and
// value of every head; each query head moves into that space through its k_nope rows of
// kv_b_proj (W_UK), and each head's latent output leaves it through its v rows (W_UV):
//   score_j = (W_UK^T q_nope) . latent_j + q_pe . k_pe_j,   out = W_UV (sum_j p_j latent_j).
// The kernels run on CUDA cores; the cache is bf16 (no value rows).
#ifndef STRATA_COMMON_CUDA_KERNELS_LATENT_ATTENTION_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_LATENT_ATTENTION_KERNELS_H_

#include "common/cuda/cuda_types.h"
#include "common/cuda/kernels/paged_kv_kernels.h"

namespace strata::gpu {

struct LatentShape {
  int num_heads = 0;
  int nope = 0;   // qk_nope_head_dim: a query head is [nope ; rope]
  int rope = 0;   // qk_rope_head_dim, even
  int rank = 0;   // kv_lora_rank, a multiple of 32, at most 512
  int v_dim = 0;  // v_head_dim
  // DeepSeek's interleaved RoPE: the even dimensions of the rope part move before the odd ones,
  // then halves rotate (transformers' order).
  bool interleave = false;
  const float* inv_freq = nullptr;  // [rope / 2], device
  float attention_scaling = 1.0f;   // multiplies cos and sin (YaRN)
};
// A cache row is rank + rope values, a query head nope + rope.

// Whether the kernels take this shape's sizes (the launchers that rotate also need inv_freq).
bool LatentShapeFits(const LatentShape& shape);

// The cache rows of a step: kv_a [n, rank + rope] (kv_a_proj_with_mqa's output), the latent
// part RMS-normalized with `norm` [rank], the rope part rotated at the token's position, into
// the token's slot of `kv` (bf16, keys only: kv.head_dim = rank + rope, one kv head).
cudaError_t LaunchLatentKvAppend(const bf16* kv_a, const bf16* norm, float eps,
                                 const LatentShape& shape, const TokenBatch& tokens,
                                 const PagedKvLayer& kv, cudaStream_t stream);

// The queries in cache space: q [n, heads * (nope + rope)] -> queries [n, heads, rank + rope],
// W_UK^T q_nope then the rotated q_pe. kv_b: [heads * (nope + v_dim), rank] bf16, per head its
// k_nope rows then its v rows.
cudaError_t LaunchLatentQueries(const bf16* q, const bf16* kv_b, const LatentShape& shape,
                                const int32_t* positions, int64_t n, bf16* queries,
                                cudaStream_t stream);

// Causal attention of each token's heads over its sequence's rows 0..pos (softmax scaled by
// `scale`): latent_out [n, heads, rank].
cudaError_t LaunchLatentAttention(const bf16* queries, const LatentShape& shape, float scale,
                                  const TokenBatch& tokens, const PagedKvLayer& kv,
                                  bf16* latent_out, cudaStream_t stream);

// out [n, heads * v_dim]: each head's latent output through its W_UV rows of kv_b.
cudaError_t LaunchLatentValues(const bf16* latent_out, const bf16* kv_b, const LatentShape& shape,
                               int64_t n, bf16* out, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_LATENT_ATTENTION_KERNELS_H_
