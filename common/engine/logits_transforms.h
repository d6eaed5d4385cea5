// What a request's sampling parameters do to a row of logits before a token is picked, with
// vLLM's definitions and order: logit_bias, min_tokens, then the repetition, frequency and
// presence penalties (min_p comes after temperature: Sampler). The token counts they read are
// kept as tokens come (TokenCounts), not recounted each step.
#ifndef STRATA_COMMON_ENGINE_LOGITS_TRANSFORMS_H_
#define STRATA_COMMON_ENGINE_LOGITS_TRANSFORMS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"

namespace strata {

// The tokens a request has seen: its prompt's and its output's, the output's with counts.
class TokenCounts {
 public:
  void AddPrompt(absl::Span<const int32_t> prompt) { seen_.insert(prompt.begin(), prompt.end()); }
  void AddOutput(int32_t token) {
    seen_.insert(token);
    ++output_[token];
  }
  const absl::flat_hash_set<int32_t>& seen() const { return seen_; }  // prompt and output
  const absl::flat_hash_map<int32_t, int>& output() const { return output_; }

 private:
  absl::flat_hash_set<int32_t> seen_;
  absl::flat_hash_map<int32_t, int> output_;
};

// logits[id] += bias for each (id, bias); ids outside [0, vocab) are skipped.
void ApplyLogitBias(float* logits, int64_t vocab, absl::Span<const std::pair<int32_t, float>> bias);

// logits[id] = -inf for each id in [0, vocab): tokens that cannot be drawn (min_tokens).
void SuppressTokens(float* logits, int64_t vocab, absl::Span<const int32_t> ids);

// For each token seen (prompt or output): a positive logit divided by `penalty`, a negative
// one multiplied by it (vLLM's and transformers' repetition_penalty; 1 changes nothing).
void ApplyRepetitionPenalty(float* logits, int64_t vocab, const absl::flat_hash_set<int32_t>& seen,
                            float penalty);

// For each token the output holds `count` times: logit -= frequency x count + presence (the
// OpenAI penalties; only the output counts, not the prompt).
void ApplyFrequencyPresencePenalties(float* logits, int64_t vocab,
                                     const absl::flat_hash_map<int32_t, int>& output,
                                     float frequency, float presence);

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_LOGITS_TRANSFORMS_H_
