// A generation request as the scheduler sees it, and where its output goes.
#ifndef STRATA_SERVICES_ROUTER_REQUEST_H_
#define STRATA_SERVICES_ROUTER_REQUEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/sampler.h"
#include "common/engine/token_constraint.h"

namespace strata {

// The most alternatives a token's log-probability comes with (RequestSpec::top_logprobs): vLLM's
// default max_logprobs, and OpenAI's bound.
inline constexpr int kMaxTopLogprobs = 20;

// The most samples one request may ask for (RequestSpec::n).
inline constexpr int kMaxSamples = 16;

// A token's log-probability under the model's distribution (log softmax of the raw logits),
// and the most likely tokens at its position with theirs: most likely first, ties by lower id.
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (token id, log-probability)
};

struct RequestSpec {
  std::string id;
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings; need a tokenizer
  bool ignore_eos = false;
  // Report the log-probability of each generated token under the model's distribution (the
  // logits before penalties, bias, temperature, top-k and top-p): ResponseSink::OnLogprobs.
  bool logprobs = false;
  // Report the log-probability of each prompt token after the first (ResponseSink::OnScores)
  // before generating: what an echoed prompt's log-probabilities are.
  bool prompt_logprobs = false;
  // Prefill only: report the prompt tokens' log-probabilities as prompt_logprobs does, generate
  // nothing (max_new_tokens is ignored).
  bool score_only = false;
  // With logprobs, prompt_logprobs or score_only: each token's log-probability comes with this
  // many most likely tokens at its position (TokenLogprobs::top); 0..kMaxTopLogprobs.
  int top_logprobs = 0;
  // The grammar the output follows (a response format's, common/grammar/); null: free text.
  // Its tokens are picked on the host (the mask is computed there), without drafts; the
  // request ends once the grammar is complete and has taken an end-of-sequence token.
  std::shared_ptr<const CompiledConstraint> constraint;
  // Samples of the prompt, 1..kMaxSamples: the prompt is prefilled once, then the sequence
  // forks into n sharing its KV blocks (the last partial one copied), each drawing its tokens
  // from its own seed, sample i's being sampling.seed + i (so sample i is what a request of
  // one sample with that seed gets). Each has its own sink (Scheduler::Submit); prompt scores
  // (prompt_logprobs) go to the first one's only. Not with score_only.
  int n = 1;
};

enum class FinishReason { kNone, kLength, kStop, kEos, kCancelled, kError };

struct RequestUsage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  double time_to_first_token_ms = 0.0;
  double decode_tokens_per_second = 0.0;
};

// Receives a request's output. Called from the scheduler's thread: implementations must not
// block (queue the data and return).
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // New tokens since the last call, and their text (empty without a tokenizer).
  virtual void OnTokens(const std::vector<int32_t>& ids, const std::string& text) = 0;
  // With RequestSpec::logprobs, just before each OnTokens: log p of each of its ids.
  virtual void OnLogprobs(const std::vector<TokenLogprobs>& logprobs) {}
  // With RequestSpec::prompt_logprobs or score_only, once, before the first OnTokens (or
  // OnFinish): entry i is log p(prompt[i + 1] | prompt[0..i]), one fewer than the prompt.
  virtual void OnScores(const std::vector<TokenLogprobs>& scores) {}
  // The last call. `status` is OK unless the reason is kError.
  virtual void OnFinish(FinishReason reason, const RequestUsage& usage,
                        const absl::Status& status) = 0;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_REQUEST_H_
