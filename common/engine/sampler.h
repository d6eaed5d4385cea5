// Picks the next token from a row of logits: greedy, or temperature with top-k / top-p /
// min_p, after the request's logit transforms (logits_transforms.h) and its grammar's mask
// (token_constraint.h). Draws are Philox
// uniforms of (seed, token index) (common/util/philox.h), the ones the device's sampling kernel
// takes: a token is the same whether the host or the GPU picked it (up to rounding).
#ifndef STRATA_COMMON_ENGINE_SAMPLER_H_
#define STRATA_COMMON_ENGINE_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/backend/row_sampling.h"
#include "common/engine/logits_transforms.h"
#include "common/engine/token_constraint.h"
#include "common/util/token_cut.h"

namespace strata {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, first index on ties)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // nucleus mass kept, in (0, 1]
  uint64_t seed = 0;         // same seed, same draws
  // Tokens with probability (after temperature) below min_p x the largest are not drawn.
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // by token id
  // Until this many tokens are generated, the end-of-sequence tokens (those the Sampler is
  // given) and stop_token_ids cannot be drawn.
  int min_tokens = 0;

  // How a request ends and what its text shows: the scheduler's, not the sampler's.
  std::vector<int32_t> stop_token_ids;      // sorted, unique: generating one ends the request
  bool include_stop_str_in_output = false;  // the stop string (or stop token's text) stays
  bool skip_special_tokens = true;          // special tokens' text is left out
};

absl::Status ValidateSamplingParams(const SamplingParams& params);

// The index of the largest of values[0, n), the first on ties, NaN never (0 when all are NaN),
// in two vectorizable passes: a greedy token of a 150k vocabulary is on every decode step's path.
int64_t ArgMax(const float* values, int64_t n);

class Sampler {
 public:
  // `prompt`: the tokens the repetition penalty counts besides the output's; `eos`: the tokens
  // min_tokens holds back with stop_token_ids (none for a request that ignores them);
  // `constraint`: the grammar the output follows (null: none), masked after every transform.
  explicit Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt = {},
                   absl::Span<const int> eos = {},
                   std::unique_ptr<TokenConstraint> constraint = nullptr);

  // The next token from `logits` (the model's row: this sampler applies its transforms to a
  // copy of it).
  int32_t Sample(const float* logits, int64_t vocab);
  // Every generated token, in order, once it is taken: the penalties and min_tokens count it,
  // the grammar advances past it. False when the grammar does not allow it (the request
  // cannot go on).
  bool Accept(int32_t token);

  // Speculative decoding: whether the drafted token `draft` (proposed with certainty, as a
  // prompt-lookup draft is) stands where this sampler would draw from `logits`. Greedy: it is
  // the argmax. Otherwise exact rejection sampling: accepted with the probability p(draft) this
  // sampler gives it (temperature, top-k, top-p applied); when rejected, `replacement` is drawn
  // from p without the draft, renormalized, so the token that results is distributed as p.
  // Not for a constrained sampler: its mask holds for the next token only (no drafts).
  bool AcceptDraft(const float* logits, int64_t vocab, int32_t draft, int32_t& replacement);

  // The settings a device picks this request's next token with (RowSampling: the GPU's decode
  // step applies the transforms and draws there), or nullopt while the host must: more tokens
  // to transform than kMaxDeviceTransformTokens, or a grammar (its mask is the host's). The
  // caller knows the other cases: logprobs, drafts. `in_flight`: tokens of this request already
  // launched and not yet Accepted (the row's step counts them; its token list does not).
  std::optional<RowSampling> device_row(int in_flight = 0);

  // Greedy: Sample is the argmax of the model's logits, which a device may compute instead.
  // False while any transform applies (a penalty or bias moves the argmax; min_tokens until it
  // is reached): those rows are sampled here, on the host.
  bool greedy() const { return params_.temperature == 0.0f && !transforms(); }
  // Whether Sample changes the logits before it picks, now.
  bool transforms() const {
    return penalties_ || !params_.logit_bias.empty() ||
           (generated_ < params_.min_tokens && !held_back_.empty()) || constraint_ != nullptr;
  }
  // Whether a grammar constrains the output, and whether it is complete (it took an
  // end-of-sequence token).
  bool constrained() const { return constraint_ != nullptr; }
  bool constraint_terminated() const { return constraint_ != nullptr && constraint_->terminated(); }

 private:
  // `logits`, or the transformed copy of them in scratch_.
  const float* Transformed(const float* logits, int64_t vocab);
  // The tokens a draw may pick from `logits` (token_cut.h), their logits / temperature left in
  // scaled_; false when none is (every logit NaN or -inf).
  bool Cut(const float* logits, int64_t vocab, TokenCut& cut);
  // The kept token with the largest Gumbel score under the uniforms of `stream` (`except` left
  // out): an exact draw from the kept tokens' softmax, the device's draw too.
  int32_t GumbelMax(const TokenCut& cut, uint32_t stream, int32_t except = -1) const;
  // Whether token i is kept (after Cut): keys_ holds 0 for those min_p and NaN rule out.
  bool kept(int64_t i, const TokenCut& cut) const {
    return keys_[i] != 0 && InCut(keys_[i], static_cast<int32_t>(i), cut);
  }
  float Uniform(uint32_t stream) const;

  SamplingParams params_;
  std::vector<float> scaled_;     // logits / temperature (Cut)
  std::vector<uint32_t> keys_;    // OrderedKey of scaled_, 0 for tokens never kept (Cut)
  std::vector<uint64_t> masses_;  // fixed-point weights of the kept tokens (Cut, top_p)
  std::vector<int32_t> pool_;     // Cut's radix passes
  std::vector<float> scratch_;
  bool penalties_ = false;  // a penalty is set: counts_ are kept
  TokenCounts counts_;
  std::vector<int32_t> held_back_;  // until min_tokens: eos and stop_token_ids
  std::unique_ptr<TokenConstraint> constraint_;
  int generated_ = 0;
  // The device's copy of the transforms' tokens (device_row), as of list_step_ outputs, and
  // the outputs taken since: it is updated, not rebuilt, as tokens come.
  std::shared_ptr<const std::vector<TransformToken>> device_list_;
  int list_step_ = -1;
  bool list_held_back_ = false;  // device_list_ holds the min_tokens entries
  std::vector<int32_t> outputs_since_list_;
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_SAMPLER_H_
