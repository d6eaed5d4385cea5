// Multi-head latent attention (DeepSeek-V3, Kimi-K2) on the CUDA router backend, in the
// absorbed form of the CPU backend (cpu_latent_attention.cc): the projections through
// LinearRunner, then latent_attention_kernels.h's four launches over the latent cache.
#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_router_backend.h"
#include "common/cuda/kernels/latent_attention_kernels.h"
#include "common/cuda/kernels/norm_kernels.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

LatentShape ShapeOf(const ModelConfig& c, const float* inv_freq, float attention_scaling) {
  LatentShape s;
  s.num_heads = c.num_heads;
  s.nope = c.qk_nope_head_dim;
  s.rope = c.RopeDim();
  s.rank = c.kv_lora_rank;
  s.v_dim = c.v_head_dim;
  s.interleave = c.rope_interleave;
  s.inv_freq = inv_freq;
  s.attention_scaling = attention_scaling;
  return s;
}

}  // namespace

absl::Status CudaRouterBackend::LoadLatentWeights(const AttentionWeights& a, WeightFormat format,
                                                  LayerWeights& dst) {
  const ModelConfig& c = config_;
  // The kernels' limits, checked before anything is uploaded.
  if (!LatentShapeFits(ShapeOf(c, nullptr, 1.0f))) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA latent attention takes kv_lora_rank a multiple of 32 up to 512, "
        "qk_nope_head_dim up to 256 and rows of a multiple of 4 values; this model has rank ",
        c.kv_lora_rank, ", nope ", c.qk_nope_head_dim, ", rope ", c.RopeDim()));
  }
  if (a.q_a.present()) {
    ASSIGN_OR_RETURN(dst.q_a, store_.Matrix(a.q_a, {}, format));
    ASSIGN_OR_RETURN(dst.q_a_norm, store_.Vector(a.q_a_norm));
  }
  ASSIGN_OR_RETURN(dst.kv_a, store_.Matrix(a.kv_a, {}, format));
  ASSIGN_OR_RETURN(dst.kv_a_norm, store_.Vector(a.kv_a_norm));
  // bf16 always: the kernels read its rows both ways (W_UK transposed, W_UV as it is).
  ASSIGN_OR_RETURN(dst.kv_b, store_.Matrix(a.kv_b));
  return absl::OkStatus();
}

absl::Status CudaRouterBackend::LatentAttention(int layer) {
  const ModelConfig& c = config_;
  const LayerWeights& lw = layers_[layer];
  const int64_t n = step_tokens_;
  cudaStream_t stream = context_->stream();
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (lw.q_a.data != nullptr) {
    RETURN_IF_ERROR(linear_.Run(lw.q_a, normed_.data(), n, latent_q_.data(), OutType::kBf16));
    CUDA_RETURN_IF_ERROR(LaunchRmsNorm(latent_q_.data(), lw.q_a_norm, n, c.q_lora_rank, eps,
                                       latent_q_.data(), stream));
    RETURN_IF_ERROR(linear_.Run(lw.q, latent_q_.data(), n, q_.data(), OutType::kBf16));
  } else {
    RETURN_IF_ERROR(linear_.Run(lw.q, normed_.data(), n, q_.data(), OutType::kBf16));
  }
  RETURN_IF_ERROR(linear_.Run(lw.kv_a, normed_.data(), n, k_.data(), OutType::kBf16));

  const LatentShape shape = ShapeOf(c, inv_freq_, attention_scaling_);
  const PagedKvLayer cache = KvLayer(layer);
  const TokenBatch tokens{token_seq_.data(), positions_.data(), n};
  CUDA_RETURN_IF_ERROR(
      LaunchLatentKvAppend(k_.data(), lw.kv_a_norm, eps, shape, tokens, cache, stream));
  CUDA_RETURN_IF_ERROR(LaunchLatentQueries(q_.data(), static_cast<const bf16*>(lw.kv_b.data), shape,
                                           positions_.data(), n, latent_queries_.data(), stream));
  CUDA_RETURN_IF_ERROR(LaunchLatentAttention(latent_queries_.data(), shape,
                                             static_cast<float>(c.softmax_scale), tokens, cache,
                                             latent_out_.data(), stream));
  CUDA_RETURN_IF_ERROR(LaunchLatentValues(
      latent_out_.data(), static_cast<const bf16*>(lw.kv_b.data), shape, n, attn_.data(), stream));
  return FinishAttention(layer);
}

}  // namespace strata::gpu
