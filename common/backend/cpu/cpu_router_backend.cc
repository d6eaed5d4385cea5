#include "common/backend/cpu/cpu_router_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/routing.h"
#include "common/tensor/dtype.h"
#include "common/util/status_macros.h"

namespace strata {

CpuRouterBackend::CpuRouterBackend(const Model& model, ThreadPool& pool)
    : config_(model.config),
      weights_(model.weights),
      pool_(pool),
      rope_(BuildRopeTable(model.config.rope, model.config.RopeDim())) {
  correction_bias_.resize(weights_.layers.size());
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const WeightVector& bias = weights_.layers[l].router_correction_bias;
    for (int64_t e = 0; e < bias.size; ++e) correction_bias_[l].push_back(bias.At(e));
  }
}

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
  if (config_.mla()) return LatentAttention(layer);
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
      ApplyRope(rope_, pos, qh, c.RopeDim());
    }
    for (int head = 0; head < c.num_kv_heads; ++head) {
      float* kh = k_.row(t) + head * d;
      if (c.qk_norm) cpu::RmsNorm(kh, a.k_norm, d, c.rms_norm_eps, kh);
      ApplyRope(rope_, pos, kh, c.RopeDim());
    }
  }
  WriteKv(layer, kv);

  attn_out_.Resize(n, q_dim);
  pool_.ParallelFor(n * c.num_heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / c.num_heads;
      const int head = static_cast<int>(item % c.num_heads);
      AttendHead(layer, kv, t, head, scores, attn_out_.row(t) + int64_t{head} * d);
    }
  });

  proj_out_.Resize(n, h);
  cpu::Linear(pool_, attn_out_.data(), n, a.o, a.o_bias, proj_out_.data());
  for (int64_t i = 0; i < n * h; ++i) hidden.data()[i] += proj_out_.data()[i];
  return absl::OkStatus();
}

void CpuRouterBackend::WriteKv(int layer, PagedKvCache& kv) {
  const ModelConfig& c = config_;
  const int d = c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * d;
  const int64_t n = batch_.num_tokens();
  if (!kv.options().fp8()) {
    for (int64_t t = 0; t < n; ++t) {
      std::copy(k_.row(t), k_.row(t) + kv_dim,
                kv.key(layer, batch_.sequence[t], batch_.position[t]));
      std::copy(v_.row(t), v_.row(t) + kv_dim,
                kv.value(layer, batch_.sequence[t], batch_.position[t]));
    }
    return;
  }
  const int64_t heads = int64_t{c.num_layers} * c.num_kv_heads;
  if (kv.calibrating()) {
    if (static_cast<int64_t>(k_amax_.size()) != heads) {
      k_amax_.assign(heads, 0.0f);
      v_amax_.assign(heads, 0.0f);
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < kv_dim; ++i) {
        const int64_t at = int64_t{layer} * c.num_kv_heads + i / d;
        k_amax_[at] = std::max(k_amax_[at], std::fabs(k_.row(t)[i]));
        v_amax_[at] = std::max(v_amax_[at], std::fabs(v_.row(t)[i]));
      }
    }
    if (layer == 0) observed_tokens_ += n;
  }
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  if (kv.scales_ready()) {
    k_scale = kv.scales().k.data() + int64_t{layer} * c.num_kv_heads;
    v_scale = kv.scales().v.data() + int64_t{layer} * c.num_kv_heads;
  }
  for (int64_t t = 0; t < n; ++t) {
    const PagedKvCache::SequenceId seq = batch_.sequence[t];
    const bool wide = kv.wide(seq);
    const PagedKvCache::Fp8Slot slot =
        kv.fp8_slot(layer, kv.block_table(seq), wide, batch_.position[t]);
    const float* k = k_.row(t);
    const float* v = v_.row(t);
    if (wide) {
      uint16_t* kd = reinterpret_cast<uint16_t*>(slot.key);
      uint16_t* vd = reinterpret_cast<uint16_t*>(slot.value);
      for (int64_t i = 0; i < kv_dim; ++i) {
        kd[i] = FloatToBf16(k[i]);
        vd[i] = FloatToBf16(v[i]);
      }
    } else {
      // Narrow sequences exist only once the scales are set (PagedKvCache::AddSequence).
      for (int64_t i = 0; i < kv_dim; ++i) {
        slot.key[i] = FloatToFp8E4M3(k[i] / k_scale[i / d]);
        slot.value[i] = FloatToFp8E4M3(v[i] / v_scale[i / d]);
      }
    }
  }
}

void CpuRouterBackend::AttendHead(int layer, PagedKvCache& kv, int64_t t, int head,
                                  std::vector<float>& scores, float* out) const {
  const ModelConfig& c = config_;
  const AttentionWeights& a = weights_.layers[layer].attention;
  const int d = c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * d;
  const int kv_head = head / (c.num_heads / c.num_kv_heads);
  const int64_t kv_offset = int64_t{kv_head} * d;
  const int window = c.sliding_window[layer];
  const int block_size = kv.options().cache.block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t pos = batch_.position[t];
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  const PagedKvCache::SequenceId seq = batch_.sequence[t];
  const std::vector<int>& table = kv.block_table(seq);
  const float* qh = q_.row(t) + int64_t{head} * d;
  const bool fp8 = kv.options().fp8();
  const bool wide = fp8 && kv.wide(seq);
  float k_scale = 1.0f, v_scale = 1.0f;
  if (fp8 && !wide) {
    k_scale = kv.scales().k[int64_t{layer} * c.num_kv_heads + kv_head];
    v_scale = kv.scales().v[int64_t{layer} * c.num_kv_heads + kv_head];
  }
  // FP8 pools: one key or value row decoded to float32 (codes times the scale, or bf16).
  thread_local std::vector<float> row;
  row.resize(d);
  auto load = [&](int64_t j, int which) -> const float* {
    if (!fp8) {
      return kv.block_data(layer, table[j / block_size], which) + (j % block_size) * kv_dim +
             kv_offset;
    }
    const PagedKvCache::Fp8Slot slot = kv.fp8_slot(layer, table, wide, j);
    const uint8_t* p = which == 0 ? slot.key : slot.value;
    if (wide) {
      cpu::Bf16RowToFloat(reinterpret_cast<const uint16_t*>(p) + kv_offset, d, row.data());
    } else {
      const float s = which == 0 ? k_scale : v_scale;
      for (int i = 0; i < d; ++i) row[i] = Fp8E4M3ToFloat(p[kv_offset + i]) * s;
    }
    return row.data();
  };
  scores.resize(pos - first + 1);
  float max_score = a.sinks.present() ? a.sinks.At(head) : -INFINITY;
  for (int64_t j = first; j <= pos; ++j) {
    scores[j - first] = cpu::Dot(qh, load(j, 0), d) * scale;
    max_score = std::max(max_score, scores[j - first]);
  }
  // The sink joins the softmax's denominator but contributes no value.
  float denom = a.sinks.present() ? std::exp(a.sinks.At(head) - max_score) : 0.0f;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    denom += s;
  }
  std::fill(out, out + d, 0.0f);
  for (int64_t j = first; j <= pos; ++j) {
    const float* value = load(j, 1);
    const float p = scores[j - first] / denom;
    for (int i = 0; i < d; ++i) out[i] += p * value[i];
  }
}

absl::Status CpuRouterBackend::ReportKvRange(PagedKvCache& kv) {
  if (observed_tokens_ > 0 && kv.calibrating()) {
    kv.ObserveKvRange(k_amax_, v_amax_, observed_tokens_);
  }
  std::fill(k_amax_.begin(), k_amax_.end(), 0.0f);
  std::fill(v_amax_.begin(), v_amax_.end(), 0.0f);
  observed_tokens_ = 0;
  return absl::OkStatus();
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
    return absl::InvalidArgumentError("gate temperature must be positive");
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
  const float* bias = correction_bias_[layer].empty() ? nullptr : correction_bias_[layer].data();
  for (int64_t t = 0; t < n; ++t) {
    SelectExperts(config_, gate_logits_.row(t), temperature, bias,
                  routing.expert.data() + t * config_.top_k,
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
