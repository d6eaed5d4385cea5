// Multi-head latent attention (DeepSeek-V3) on the CPU, in the absorbed form: the cache keeps
// per token one row [normalized latent (kv_lora_rank) ; rotated k_pe (rope dim)], and each
// query head is moved into latent space instead of each cached latent being expanded into
// per-head keys and values. With W_UK and W_UV the head's k_nope and v rows of kv_b_proj:
//   score_j = (W_UK^T q_nope) . latent_j + q_pe . k_pe_j,   out = W_UV (sum_j p_j latent_j),
// which equals transformers' decompressed q_nope . (W_UK latent_j) and sum_j p_j (W_UV latent_j).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/cpu/cpu_router_backend.h"

namespace strata {
namespace {

// DeepSeek's interleaved RoPE as transformers applies it: the even dimensions are moved before
// the odd ones, then halves rotate (the rotate_half convention). Query and key both end up in
// that order, so their dot products are those of the interleaved rotation.
void ApplyLatentRope(const RopeTable& rope, int64_t pos, bool interleave, float* x, int dim,
                     std::vector<float>& tmp) {
  if (interleave) {
    tmp.assign(x, x + dim);
    for (int i = 0; i < dim / 2; ++i) {
      x[i] = tmp[2 * i];
      x[dim / 2 + i] = tmp[2 * i + 1];
    }
  }
  ApplyRope(rope, pos, x, dim);
}

// The [out, in] matrix of rows [first, first + out) of kv_b_proj, or its transpose (W_UK^T:
// kv_lora_rank outputs from qk_nope_head_dim inputs). Binding refuses per-row FP8 scales on
// kv_b, which would not follow the transpose; block scales follow any view of the stored tensor
// (WeightMatrix::ScaleAt).
WeightMatrix KvBRows(const WeightMatrix& kv_b, int64_t first, int64_t out, bool transpose) {
  WeightMatrix m = kv_b;
  m.data = static_cast<const uint8_t*>(kv_b.data) + first * kv_b.out_stride * DTypeSize(kv_b.dtype);
  if (transpose) {
    m.out = kv_b.in;
    m.in = out;
    m.out_stride = kv_b.in_stride;
    m.in_stride = kv_b.out_stride;
  } else {
    m.out = out;
  }
  return m;
}

}  // namespace

absl::Status CpuRouterBackend::LatentAttention(int layer) {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  const AttentionWeights& a = lw.attention;
  PagedKvCache& kv = *kv_;
  const int64_t n = batch_.num_tokens();
  const int64_t h = c.hidden_size;
  const int heads = c.num_heads;
  const int d = c.head_dim;  // qk_nope_head_dim + rope
  const int nope = c.qk_nope_head_dim;
  const int rope = c.RopeDim();
  const int rank = c.kv_lora_rank;
  const int row_width = c.KvHeadDim();  // rank + rope
  const int v_dim = c.v_head_dim;

  normed_.Resize(n, h);
  cpu::RmsNormRows(pool_, hidden_.data(), n, lw.input_norm, h, c.rms_norm_eps, normed_.data());
  q_.Resize(n, int64_t{heads} * d);
  if (a.q_a.present()) {
    mla_q_latent_.Resize(n, c.q_lora_rank);
    cpu::Linear(pool_, normed_.data(), n, a.q_a, WeightVector{}, mla_q_latent_.data());
    cpu::RmsNormRows(pool_, mla_q_latent_.data(), n, a.q_a_norm, c.q_lora_rank, c.rms_norm_eps,
                     mla_q_latent_.data());
    cpu::Linear(pool_, mla_q_latent_.data(), n, a.q, WeightVector{}, q_.data());
  } else {
    cpu::Linear(pool_, normed_.data(), n, a.q, WeightVector{}, q_.data());
  }
  // The cache rows: [latent ; k_pe], the latent normalized and k_pe rotated in place.
  k_.Resize(n, row_width);
  cpu::Linear(pool_, normed_.data(), n, a.kv_a, WeightVector{}, k_.data());
  std::vector<float> tmp;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch_.position[t];
    float* row = k_.row(t);
    cpu::RmsNorm(row, a.kv_a_norm, rank, c.rms_norm_eps, row);
    ApplyLatentRope(rope_, pos, c.rope_interleave, row + rank, rope, tmp);
    std::copy(row, row + row_width, kv.key(layer, batch_.sequence[t], batch_.position[t]));
  }

  // Queries in cache space, [n, heads, row_width]: W_UK^T q_nope, then the rotated q_pe.
  mla_queries_.Resize(n, int64_t{heads} * row_width);
  mla_gather_.Resize(n, std::max(nope, v_dim));
  mla_head_out_.Resize(n, std::max(rank, v_dim));
  for (int head = 0; head < heads; ++head) {
    const int64_t first = int64_t{head} * (nope + v_dim);
    for (int64_t t = 0; t < n; ++t) {
      const float* qh = q_.row(t) + int64_t{head} * d;
      std::copy(qh, qh + nope, mla_gather_.data() + t * nope);
    }
    cpu::Linear(pool_, mla_gather_.data(), n, KvBRows(a.kv_b, first, nope, /*transpose=*/true),
                WeightVector{}, mla_head_out_.data());
    for (int64_t t = 0; t < n; ++t) {
      float* qc = mla_queries_.row(t) + int64_t{head} * row_width;
      std::copy(mla_head_out_.data() + t * rank, mla_head_out_.data() + (t + 1) * rank, qc);
      std::copy(q_.row(t) + int64_t{head} * d + nope, q_.row(t) + int64_t{head} * d + d, qc + rank);
      ApplyLatentRope(rope_, batch_.position[t], c.rope_interleave, qc + rank, rope, tmp);
    }
  }

  // Attention over the cached rows, per (token, head), into latent outputs [n, heads, rank].
  mla_latent_out_.Resize(n, int64_t{heads} * rank);
  pool_.ParallelFor(n * heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads;
      const int head = static_cast<int>(item % heads);
      AttendLatentHead(layer, t, mla_queries_.row(t) + int64_t{head} * row_width, scores,
                       mla_latent_out_.row(t) + int64_t{head} * rank);
    }
  });

  // Each head's latent output through its W_UV, then o_proj.
  attn_out_.Resize(n, int64_t{heads} * v_dim);
  for (int head = 0; head < heads; ++head) {
    const int64_t first = int64_t{head} * (nope + v_dim) + nope;
    for (int64_t t = 0; t < n; ++t) {
      const float* src = mla_latent_out_.row(t) + int64_t{head} * rank;
      std::copy(src, src + rank, mla_head_out_.data() + t * rank);
    }
    cpu::Linear(pool_, mla_head_out_.data(), n, KvBRows(a.kv_b, first, v_dim, false),
                WeightVector{}, mla_gather_.data());
    for (int64_t t = 0; t < n; ++t) {
      std::copy(mla_gather_.data() + t * v_dim, mla_gather_.data() + (t + 1) * v_dim,
                attn_out_.row(t) + int64_t{head} * v_dim);
    }
  }
  proj_out_.Resize(n, h);
  cpu::Linear(pool_, attn_out_.data(), n, a.o, WeightVector{}, proj_out_.data());
  for (int64_t i = 0; i < n * h; ++i) hidden_.data()[i] += proj_out_.data()[i];
  return absl::OkStatus();
}

void CpuRouterBackend::AttendLatentHead(int layer, int64_t t, const float* query,
                                        std::vector<float>& scores, float* out) const {
  const ModelConfig& c = config_;
  PagedKvCache& kv = *kv_;
  const int rank = c.kv_lora_rank;
  const int row_width = c.KvHeadDim();
  const int block_size = kv.options().cache.block_size;
  const float scale = static_cast<float>(c.softmax_scale);
  const int64_t pos = batch_.position[t];
  const std::vector<int>& table = kv.block_table(batch_.sequence[t]);
  auto row = [&](int64_t j) {
    return kv.block_data(layer, table[j / block_size], 0) + (j % block_size) * row_width;
  };
  scores.resize(pos + 1);
  float max_score = -INFINITY;
  for (int64_t j = 0; j <= pos; ++j) {
    scores[j] = cpu::Dot(query, row(j), row_width) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  float denom = 0.0f;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    denom += s;
  }
  std::fill(out, out + rank, 0.0f);
  for (int64_t j = 0; j <= pos; ++j) {
    const float* latent = row(j);
    const float p = scores[j] / denom;
    for (int i = 0; i < rank; ++i) out[i] += p * latent[i];
  }
}

}  // namespace strata
