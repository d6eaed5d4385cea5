#include "common/backend/cpu/cpu_router_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/util/status_macros.h"

namespace strata {

CpuRouterBackend::CpuRouterBackend(const Model& model, ThreadPool& pool)
    : config_(model.config),
      weights_(model.weights),
      pool_(pool),
      rope_(BuildRopeTable(model.config.rope, model.config.head_dim)) {}

absl::Status CpuRouterBackend::BeginStep(absl::Span<const int32_t> ids, const BatchLayout& batch,
                                         PagedKvCache& kv) {
  const int64_t h = config_.hidden_size;
  if (batch.num_tokens() != static_cast<int64_t>(ids.size()) ||
      batch.sequence.size() != batch.position.size()) {
    return absl::InvalidArgumentError("cpu backend: the batch does not match the ids");
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    if (batch.position[t] >= kv.capacity(batch.sequence[t])) {
      return absl::FailedPreconditionError(absl::StrCat("attention: position ", batch.position[t],
                                                        " is not reserved in the kv cache"));
    }
  }
  batch_ = batch;
  kv_ = &kv;
  hidden_.Resize(static_cast<int64_t>(ids.size()), h);
  const WeightMatrix& e = weights_.embedding;
  for (size_t t = 0; t < ids.size(); ++t) {
    float* row = hidden_.row(static_cast<int64_t>(t));
    for (int64_t i = 0; i < h; ++i) row[i] = e.At(ids[t], i);
  }
  return absl::OkStatus();
}

absl::Status CpuRouterBackend::Attention(int layer) {
  if (kv_ == nullptr) return absl::FailedPreconditionError("attention: no step begun");
  const BatchLayout& batch = batch_;
  PagedKvCache& kv = *kv_;
  Tensor& hidden = hidden_;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  const AttentionWeights& a = lw.attention;
  const int64_t n = batch.num_tokens();
  const int64_t h = c.hidden_size;
  const int d = c.head_dim;
  const int64_t q_dim = int64_t{c.num_heads} * d;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * d;
  normed_.Resize(n, h);
  cpu::RmsNormRows(pool_, hidden.data(), n, lw.input_norm, h, c.rms_norm_eps, normed_.data());
  q_.Resize(n, q_dim);
  k_.Resize(n, kv_dim);
  v_.Resize(n, kv_dim);
  cpu::Linear(pool_, normed_.data(), n, a.q, a.q_bias, q_.data());
  cpu::Linear(pool_, normed_.data(), n, a.k, a.k_bias, k_.data());
  cpu::Linear(pool_, normed_.data(), n, a.v, a.v_bias, v_.data());

  // Per-head q/k norm and rotary embedding, then the new keys and values into the cache.
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch.position[t];
    for (int head = 0; head < c.num_heads; ++head) {
      float* qh = q_.row(t) + head * d;
      if (c.qk_norm) cpu::RmsNorm(qh, a.q_norm, d, c.rms_norm_eps, qh);
      ApplyRope(rope_, pos, qh, d);
    }
    for (int head = 0; head < c.num_kv_heads; ++head) {
      float* kh = k_.row(t) + head * d;
      if (c.qk_norm) cpu::RmsNorm(kh, a.k_norm, d, c.rms_norm_eps, kh);
      ApplyRope(rope_, pos, kh, d);
    }
    std::copy(k_.row(t), k_.row(t) + kv_dim, kv.key(layer, batch.sequence[t], pos));
    std::copy(v_.row(t), v_.row(t) + kv_dim, kv.value(layer, batch.sequence[t], pos));
  }

  attn_out_.Resize(n, q_dim);
  const int group = c.num_heads / c.num_kv_heads;
  const int window = c.sliding_window[layer];
  const int block_size = kv.options().block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  pool_.ParallelFor(n * c.num_heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / c.num_heads;
      const int head = static_cast<int>(item % c.num_heads);
      const int64_t kv_offset = int64_t{head / group} * d;
      const int64_t pos = batch.position[t];
      const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const std::vector<int>& table = kv.block_table(batch.sequence[t]);
      const float* qh = q_.row(t) + int64_t{head} * d;
      scores.resize(pos - first + 1);
      float max_score = a.sinks.present() ? a.sinks.At(head) : -INFINITY;
      for (int64_t j = first; j <= pos; ++j) {
        const float* key =
            kv.block_data(layer, table[j / block_size], 0) + (j % block_size) * kv_dim + kv_offset;
        scores[j - first] = cpu::Dot(qh, key, d) * scale;
        max_score = std::max(max_score, scores[j - first]);
      }
      // The sink joins the softmax's denominator but contributes no value.
      float denom = a.sinks.present() ? std::exp(a.sinks.At(head) - max_score) : 0.0f;
      for (float& s : scores) {
        s = std::exp(s - max_score);
        denom += s;
      }
      float* out = attn_out_.row(t) + int64_t{head} * d;
      std::fill(out, out + d, 0.0f);
      for (int64_t j = first; j <= pos; ++j) {
        const float* value =
            kv.block_data(layer, table[j / block_size], 1) + (j % block_size) * kv_dim + kv_offset;
        const float p = scores[j - first] / denom;
        for (int i = 0; i < d; ++i) out[i] += p * value[i];
      }
    }
  });

  proj_out_.Resize(n, h);
  cpu::Linear(pool_, attn_out_.data(), n, a.o, a.o_bias, proj_out_.data());
  for (int64_t i = 0; i < n * h; ++i) hidden.data()[i] += proj_out_.data()[i];
  return absl::OkStatus();
}

void CpuRouterBackend::SelectExperts(float* logits, float temperature, int32_t* experts,
                                     float* weights) const {
  const int e_count = config_.num_experts;
  const int k = config_.top_k;
  for (int e = 0; e < e_count; ++e) logits[e] /= temperature;
  auto softmax = [](float* v, int count) {
    const float m = *std::max_element(v, v + count);
    float sum = 0.0f;
    for (int i = 0; i < count; ++i) sum += (v[i] = std::exp(v[i] - m));
    for (int i = 0; i < count; ++i) v[i] /= sum;
  };
  if (config_.router_scoring == RouterScoring::kSoftmaxThenTopK) softmax(logits, e_count);
  // Top k by value; ties go to the lower expert id.
  std::vector<int> order(e_count);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int x, int y) {
    return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
  });
  for (int i = 0; i < k; ++i) {
    experts[i] = order[i];
    weights[i] = logits[order[i]];
  }
  if (config_.router_scoring == RouterScoring::kTopKThenSoftmax) {
    softmax(weights, k);
  } else if (config_.norm_topk_prob) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += weights[i];
    for (int i = 0; i < k; ++i) weights[i] /= sum;
  }
}

absl::Status CpuRouterBackend::PrepareFfn(int layer, float temperature, Tensor& ffn_input,
                                          RoutingTable& routing) {
  RETURN_IF_ERROR(NormAndRoute(layer, temperature, ffn_input_, routing));
  ffn_input = ffn_input_;  // shares the buffer
  return absl::OkStatus();
}

absl::Status CpuRouterBackend::PredictRouting(int layer, float temperature,
                                              RoutingTable& predicted) {
  if (!config_.layer_is_moe[layer]) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " has no experts to predict"));
  }
  return NormAndRoute(layer, temperature, predict_input_, predicted);
}

absl::Status CpuRouterBackend::NormAndRoute(int layer, float temperature, Tensor& ffn_input,
                                            RoutingTable& routing) {
  if (!(temperature > 0.0f)) {
    return absl::InvalidArgumentError("router temperature must be positive");
  }
  const LayerWeights& lw = weights_.layers[layer];
  const int64_t n = hidden_.rows();
  const int64_t h = config_.hidden_size;
  ffn_input.Resize(n, h);
  cpu::RmsNormRows(pool_, hidden_.data(), n, lw.post_attention_norm, h, config_.rms_norm_eps,
                   ffn_input.data());
  if (!config_.layer_is_moe[layer]) {
    routing.Resize(n, 0);
    return absl::OkStatus();
  }
  const int e_count = config_.num_experts;
  gate_logits_.Resize(n, e_count);
  cpu::Linear(pool_, ffn_input.data(), n, lw.router, lw.router_bias, gate_logits_.data());
  routing.Resize(n, config_.top_k);
  for (int64_t t = 0; t < n; ++t) {
    SelectExperts(gate_logits_.row(t), temperature, routing.expert.data() + t * config_.top_k,
                  routing.weight.data() + t * config_.top_k);
  }
  return absl::OkStatus();
}

absl::Status CpuRouterBackend::DenseFfn(int layer) {
  const Tensor& ffn_input = ffn_input_;
  Tensor& hidden = hidden_;
  const LayerWeights& lw = weights_.layers[layer];
  const FfnWeights* ffn = lw.dense_mlp       ? &*lw.dense_mlp
                          : lw.shared_expert ? &*lw.shared_expert
                                             : nullptr;
  if (ffn == nullptr) return absl::OkStatus();
  const int64_t n = ffn_input.rows();
  const int64_t h = config_.hidden_size;
  ffn_scratch_.Resize(2 * n, ffn->gate.out);
  ffn_out_.Resize(n, h);
  cpu::Ffn(pool_, config_, *ffn, ffn_input.data(), n, ffn_scratch_.data(), ffn_out_.data());
  for (int64_t t = 0; t < n; ++t) {
    float scale = 1.0f;
    if (lw.shared_expert_gate.present()) {
      float g = 0.0f;
      for (int64_t i = 0; i < h; ++i) g += lw.shared_expert_gate.At(0, i) * ffn_input.row(t)[i];
      scale = 1.0f / (1.0f + std::exp(-g));
    }
    for (int64_t i = 0; i < h; ++i) hidden.row(t)[i] += scale * ffn_out_.row(t)[i];
  }
  return absl::OkStatus();
}

absl::Status CpuRouterBackend::Combine(const Tensor& partial, const uint32_t* ready_flag) {
  Tensor& hidden = hidden_;
  if (ready_flag != nullptr) {
    return absl::InvalidArgumentError("combine: a host backend cannot wait on a device flag");
  }
  if (partial.rows() != hidden.rows() || partial.cols() != hidden.cols()) {
    return absl::InvalidArgumentError("combine: partial result does not match the hidden state");
  }
  for (int64_t i = 0; i < hidden.size(); ++i) hidden.data()[i] += partial.data()[i];
  return absl::OkStatus();
}

absl::Status CpuRouterBackend::Logits(absl::Span<const int64_t> rows, Tensor& logits) {
  const Tensor& hidden = hidden_;
  const int64_t h = config_.hidden_size;
  const int64_t n = static_cast<int64_t>(rows.size());
  normed_.Resize(n, h);
  for (int64_t r = 0; r < n; ++r) {
    if (rows[r] < 0 || rows[r] >= hidden.rows()) {
      return absl::InvalidArgumentError("logits: row outside the hidden state");
    }
    cpu::RmsNorm(hidden.row(rows[r]), weights_.final_norm, h, config_.rms_norm_eps, normed_.row(r));
  }
  logits.Resize(n, config_.vocab_size);
  cpu::Linear(pool_, normed_.data(), n, weights_.lm_head, WeightVector{}, logits.data());
  return absl::OkStatus();
}

}  // namespace strata
