#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/util/philox.h"
#include "common/util/token_cut.h"

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
                 absl::Span<const int> eos, std::unique_ptr<TokenConstraint> constraint)
    : params_(params), constraint_(std::move(constraint)) {
  penalties_ = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
               params_.frequency_penalty != 0.0f;
  if (penalties_ && params_.repetition_penalty != 1.0f) counts_.AddPrompt(prompt);
  if (params_.min_tokens > 0) {
    held_back_.assign(eos.begin(), eos.end());
    held_back_.insert(held_back_.end(), params_.stop_token_ids.begin(),
                      params_.stop_token_ids.end());
  }
}

bool Sampler::Accept(int32_t token) {
  ++generated_;
  if (penalties_) {
    counts_.AddOutput(token);
    if (device_list_ != nullptr) outputs_since_list_.push_back(token);
  }
  return constraint_ == nullptr || constraint_->Accept(token);
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
  // Last: nothing after it may lift a token the grammar rules out.
  if (constraint_ != nullptr) constraint_->MaskLogits(x, vocab);
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
  if (constraint_ != nullptr) return std::nullopt;  // the mask is computed here
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
  TokenCut cut;
  if (!Cut(logits, vocab, cut)) return 0;  // nothing drawable
  return GumbelMax(cut, kPhiloxSample);
}

namespace {

// The cut keeping the first tokens (by key, then index) of those in `within` whose amounts
// reach `target` (at most their total). keys[i]: token i's key, 0 when it is never kept. Four
// 8-bit radix passes from the top digit find the cut key, each over the tokens `pool` still
// holds (in index order), then the tokens on it are taken by index. The sampling kernel's
// passes find the same.
template <typename AmountFn>
TokenCut PrefixReaching(absl::Span<const uint32_t> keys, const TokenCut& within, uint64_t target,
                        std::vector<int32_t>& pool, AmountFn&& amount) {
  pool.clear();
  for (int64_t i = 0; i < std::ssize(keys); ++i) {
    if (keys[i] != 0 && InCut(keys[i], static_cast<int32_t>(i), within)) {
      pool.push_back(static_cast<int32_t>(i));
    }
  }
  uint64_t remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint64_t hist[256] = {};
    for (int32_t i : pool) hist[(keys[i] >> shift) & 255] += amount(i);
    uint32_t digit = 255;
    uint64_t above = 0;
    for (; digit > 0 && above + hist[digit] < remaining; --digit) above += hist[digit];
    remaining -= above;
    std::erase_if(pool, [&](int32_t i) { return ((keys[i] >> shift) & 255) != digit; });
  }
  // The pool holds the tokens on the cut key, by index.
  TokenCut cut = within;
  if (pool.empty()) return cut;  // unreachable with target <= the total
  cut.key = keys[pool[0]];
  uint64_t taken = 0;
  for (int32_t i : pool) {
    taken += amount(i);
    if (taken >= remaining) {
      cut.last_index = i;
      break;
    }
  }
  return cut;
}

}  // namespace

bool Sampler::Cut(const float* logits, int64_t vocab, TokenCut& cut) {
  scaled_.resize(vocab);
  float x0 = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    scaled_[i] = logits[i] / params_.temperature;
    x0 = std::max(x0, scaled_[i]);  // a NaN never wins
  }
  if (x0 == -std::numeric_limits<float>::infinity()) return false;
  cut = TokenCut{.x0 = x0, .min_p = params_.min_p};
  keys_.resize(vocab);
  int64_t candidates = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const bool kept = Kept(scaled_[i], static_cast<int32_t>(i), cut);
    keys_[i] = kept ? OrderedKey(scaled_[i]) : 0;
    candidates += kept;
  }
  if (params_.top_k > 0 && params_.top_k < candidates) {
    cut = PrefixReaching(keys_, cut, static_cast<uint64_t>(params_.top_k), pool_,
                         [](int32_t) { return uint64_t{1}; });
  }
  if (params_.top_p < 1.0f) {
    masses_.resize(vocab);
    uint64_t total = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      masses_[i] = kept(i, cut) ? FixedMass(std::exp(scaled_[i] - x0)) : 0;
      total += masses_[i];
    }
    cut = PrefixReaching(keys_, cut, NucleusTarget(params_.top_p, total), pool_,
                         [&](int32_t i) { return masses_[i]; });
  }
  return true;
}

int32_t Sampler::GumbelMax(const TokenCut& cut, uint32_t stream, int32_t except) const {
  const int64_t vocab = std::ssize(scaled_);
  const uint64_t step = static_cast<uint64_t>(generated_);
  float best = -std::numeric_limits<float>::infinity();
  int32_t token = -1;
  for (int64_t base = 0; base < vocab; base += 4) {
    // Philox only for blocks with a token kept (a nucleus is often small).
    std::optional<Philox4> bits;
    for (int64_t i = base; i < std::min(base + 4, vocab); ++i) {
      if (i == except || !kept(i, cut)) continue;
      if (!bits) bits = PhiloxBlock(params_.seed, step, stream, static_cast<uint32_t>(base));
      const float v = GumbelScore(scaled_[i], UniformFromBits(bits->v[i - base]));
      if (token < 0 || v > best) {
        best = v;
        token = static_cast<int32_t>(i);
      }
    }
  }
  return std::max(token, 0);
}

bool Sampler::AcceptDraft(const float* model_logits, int64_t vocab, int32_t draft,
                          int32_t& replacement) {
  const float* logits = Transformed(model_logits, vocab);
  if (params_.temperature == 0.0f) {
    replacement = static_cast<int32_t>(ArgMax(logits, vocab));
    return replacement == draft;
  }
  TokenCut cut;
  if (!Cut(logits, vocab, cut)) {
    replacement = 0;
    return false;
  }
  // p(draft): its weight over the kept tokens'.
  double total = 0.0, draft_weight = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!kept(i, cut)) continue;
    const double w = std::exp(double{scaled_[i]} - cut.x0);
    total += w;
    if (i == draft) draft_weight = w;
  }
  if (Uniform(kPhiloxDraftAccept) < draft_weight / total) return true;
  // The residual max(0, p - q) with q one-hot at the draft: p without the draft.
  replacement = GumbelMax(cut, kPhiloxDraftRedraw, draft);
  return false;
}

}  // namespace strata
