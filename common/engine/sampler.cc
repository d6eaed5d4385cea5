#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/util/philox.h"

namespace strata {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) return absl::InvalidArgumentError("top_k must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f) || std::isinf(p.repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", p.repetition_penalty));
  }
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty)) {
    return absl::InvalidArgumentError("presence_penalty and frequency_penalty must be finite");
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!std::isfinite(bias)) return absl::InvalidArgumentError("logit_bias must be finite");
  }
  if (p.min_tokens < 0) return absl::InvalidArgumentError("min_tokens must be >= 0");
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt,
                 absl::Span<const int> eos)
    : params_(params) {
  penalties_ = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
               params_.frequency_penalty != 0.0f;
  if (penalties_ && params_.repetition_penalty != 1.0f) counts_.AddPrompt(prompt);
  if (params_.min_tokens > 0) {
    held_back_.assign(eos.begin(), eos.end());
    held_back_.insert(held_back_.end(), params_.stop_token_ids.begin(),
                      params_.stop_token_ids.end());
  }
}

void Sampler::Accept(int32_t token) {
  ++generated_;
  if (penalties_) {
    counts_.AddOutput(token);
    if (device_list_ != nullptr) outputs_since_list_.push_back(token);
  }
}

const float* Sampler::Transformed(const float* logits, int64_t vocab) {
  if (!transforms()) return logits;
  scratch_.assign(logits, logits + vocab);
  float* x = scratch_.data();
  // vLLM's order: the bias and min_tokens (its logits processors), then the penalties.
  ApplyLogitBias(x, vocab, params_.logit_bias);
  if (generated_ < params_.min_tokens) SuppressTokens(x, vocab, held_back_);
  if (penalties_) {
    ApplyRepetitionPenalty(x, vocab, counts_.seen(), params_.repetition_penalty);
    ApplyFrequencyPresencePenalties(x, vocab, counts_.output(), params_.frequency_penalty,
                                    params_.presence_penalty);
  }
  return x;
}

int64_t ArgMax(const float* values, int64_t n) {
  if (n <= 0) return 0;
  // The largest value over independent lanes (the compiler keeps them in vector registers),
  // then the first index that holds it. std::max(m, v) keeps m when v is NaN, so a NaN never
  // wins, as on the GPU (LaunchArgmax): the same token whichever computed it.
  constexpr int kLanes = 16;
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  float lane_max[kLanes];
  for (float& m : lane_max) m = kLowest;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane_max[j] = std::max(lane_max[j], values[i + j]);
  }
  float best = kLowest;
  for (float m : lane_max) best = std::max(best, m);
  for (; i < n; ++i) best = std::max(best, values[i]);
  for (int64_t k = 0; k < n; ++k) {
    if (values[k] == best) return k;
  }
  return 0;  // every value is NaN
}

std::optional<RowSampling> Sampler::device_row(int in_flight) {
  RowSampling row{.temperature = params_.temperature,
                  .top_k = params_.top_k,
                  .top_p = params_.top_p,
                  .min_p = params_.min_p,
                  .seed = params_.seed,
                  .step = static_cast<uint64_t>(generated_ + in_flight)};
  if (!transforms()) {
    row.list_step = row.step;
    return row;
  }
  row.repetition_penalty = params_.repetition_penalty;
  row.presence_penalty = params_.presence_penalty;
  row.frequency_penalty = params_.frequency_penalty;
  row.min_tokens = params_.min_tokens;
  const bool held_back = generated_ < params_.min_tokens && !held_back_.empty();
  if (device_list_ == nullptr || held_back != list_held_back_) {
    // Made whole: the seen tokens with their output counts, the biases, the held-back ids.
    absl::flat_hash_map<int32_t, TransformToken> by_token;
    for (int32_t id : counts_.seen()) by_token[id].flags |= TransformToken::kSeen;
    for (const auto& [id, count] : counts_.output()) by_token[id].output_count = count;
    for (const auto& [id, bias] : params_.logit_bias) by_token[id].bias += bias;
    if (held_back) {
      for (int32_t id : held_back_) by_token[id].flags |= TransformToken::kHeldBack;
    }
    auto list = std::make_shared<std::vector<TransformToken>>();
    list->reserve(by_token.size());
    for (auto& [id, entry] : by_token) {
      entry.token = id;
      list->push_back(entry);
    }
    std::sort(list->begin(), list->end(),
              [](const TransformToken& a, const TransformToken& b) { return a.token < b.token; });
    device_list_ = std::move(list);
    list_held_back_ = held_back;
    outputs_since_list_.clear();
  } else if (!outputs_since_list_.empty()) {
    // A copy with the new outputs counted (the one before may still be in a step in flight).
    auto list = std::make_shared<std::vector<TransformToken>>(*device_list_);
    for (int32_t token : outputs_since_list_) {
      auto at = std::lower_bound(
          list->begin(), list->end(), token,
          [](const TransformToken& entry, int32_t id) { return entry.token < id; });
      if (at == list->end() || at->token != token) {
        at = list->insert(at, TransformToken{.token = token});
      }
      ++at->output_count;
      at->flags |= TransformToken::kSeen;
    }
    device_list_ = std::move(list);
    outputs_since_list_.clear();
  }
  list_step_ = generated_;
  if (std::ssize(*device_list_) > kMaxDeviceTransformTokens) return std::nullopt;
  row.tokens = device_list_;
  row.list_step = static_cast<uint64_t>(list_step_);
  return row;
}

float Sampler::Uniform(uint32_t stream) const {
  return PhiloxUniform(params_.seed, static_cast<uint64_t>(generated_), stream, 0);
}

int32_t Sampler::Sample(const float* model_logits, int64_t vocab) {
  const float* logits = Transformed(model_logits, vocab);
  if (params_.temperature == 0.0f) return static_cast<int32_t>(ArgMax(logits, vocab));
  if ((params_.top_k <= 0 || params_.top_k >= vocab) && params_.top_p >= 1.0f) {
    return GumbelMax(logits, vocab);
  }
  double total = 0.0;
  const int64_t keep = Candidates(logits, vocab, total);
  if (total <= 0.0) return 0;  // nothing drawable
  return Draw(keep, total, Uniform(kPhiloxSample));
}

int32_t Sampler::GumbelMax(const float* logits, int64_t vocab) const {
  const float t = params_.temperature;
  const float x0 = params_.min_p > 0.0f ? logits[ArgMax(logits, vocab)] / t : 0.0f;
  float best = -std::numeric_limits<float>::infinity();
  int32_t token = 0;
  const uint64_t step = static_cast<uint64_t>(generated_);
  for (int64_t base = 0; base < vocab; base += 4) {
    const Philox4 bits =
        PhiloxBlock(params_.seed, step, kPhiloxSample, static_cast<uint32_t>(base));
    for (int64_t i = base; i < std::min(base + 4, vocab); ++i) {
      const float x = logits[i] / t;
      if (params_.min_p > 0.0f && !(std::exp(x - x0) >= params_.min_p)) continue;
      // A NaN never wins (v > best is false), as on the device.
      const float v = x - std::log(-std::log(UniformFromBits(bits.v[i - base])));
      if (v > best) {
        best = v;
        token = static_cast<int32_t>(i);
      }
    }
  }
  return token;
}

bool Sampler::AcceptDraft(const float* model_logits, int64_t vocab, int32_t draft,
                          int32_t& replacement) {
  const float* logits = Transformed(model_logits, vocab);
  if (params_.temperature == 0.0f) {
    replacement = static_cast<int32_t>(ArgMax(logits, vocab));
    return replacement == draft;
  }
  double total = 0.0;
  const int64_t keep = Candidates(logits, vocab, total);
  if (total <= 0.0) {
    replacement = 0;
    return false;
  }
  double p_draft = 0.0;
  int64_t at = -1;
  for (int64_t i = 0; i < keep; ++i) {
    if (candidates_[i].second == draft) {
      p_draft = candidates_[i].first / total;
      at = i;
      break;
    }
  }
  if (Uniform(kPhiloxDraftAccept) < p_draft) return true;
  // The residual max(0, p - q) with q one-hot at the draft: p without the draft.
  if (at >= 0) {
    total -= candidates_[at].first;
    candidates_[at].first = 0.0f;
  }
  replacement =
      total > 0.0 ? Draw(keep, total, Uniform(kPhiloxDraftRedraw)) : candidates_[0].second;
  return false;
}

int32_t Sampler::Draw(int64_t keep, double total, float u) {
  const double draw = u * total;
  double running = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    running += candidates_[i].first;
    if (draw < running) return candidates_[i].second;
  }
  // Rounding: the last candidate with weight.
  for (int64_t i = keep - 1; i > 0; --i) {
    if (candidates_[i].first > 0.0f) return candidates_[i].second;
  }
  return candidates_[0].second;
}

int64_t Sampler::Candidates(const float* logits, int64_t vocab, double& total) {
  candidates_.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    // A NaN logit is never drawn (and would break the ordering below).
    const float logit = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    candidates_[i] = {logit / params_.temperature, static_cast<int32_t>(i)};
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int64_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
  // Only a top-k or top-p cut needs the candidates in order; plain temperature sampling draws
  // from the whole vocabulary as it is (a full sort of 150k logits per token is not free).
  if (keep < vocab) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  }
  // Softmax over the kept candidates (exp is monotonic: the order by logit holds).
  float max_logit = candidates_[0].first;
  for (int64_t i = 1; i < keep; ++i) max_logit = std::max(max_logit, candidates_[i].first);
  total = 0.0;
  if (max_logit == -std::numeric_limits<float>::infinity()) return keep;  // nothing drawable
  for (int64_t i = 0; i < keep; ++i) {
    candidates_[i].first = std::exp(candidates_[i].first - max_logit);
    total += candidates_[i].first;
  }
  if (params_.min_p > 0.0f) {
    // The weights are p / p_max (the largest is exp(0) = 1): those below min_p go, and top_p
    // then sees the distribution renormalized without them (vLLM's order).
    total = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      if (candidates_[i].first < params_.min_p) candidates_[i].first = 0.0f;
      total += candidates_[i].first;
    }
  }
  if (params_.top_p < 1.0f) {
    // The smallest prefix with mass >= top_p. Without a top-k cut the candidates are unsorted:
    // sort growing prefixes until one holds the mass (a few hundred tokens usually do) instead
    // of the whole vocabulary. Same arithmetic as the cut below, so the cut falls inside.
    int64_t sorted = keep < vocab ? keep : 0;
    for (int64_t m = std::min<int64_t>(keep, 512); sorted == 0; m = std::min(keep, m * 8)) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + m, candidates_.begin() + keep,
                        by_logit);
      double mass = 0.0;
      for (int64_t i = 0; i < m && mass < params_.top_p; ++i) mass += candidates_[i].first / total;
      if (mass >= params_.top_p || m == keep) sorted = m;
    }
    double mass = 0.0;
    int64_t cut = 0;
    while (cut < sorted) {
      mass += candidates_[cut].first / total;
      ++cut;
      if (mass >= params_.top_p) break;
    }
    keep = cut;
    total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += candidates_[i].first;
  }
  return keep;
}

}  // namespace strata
