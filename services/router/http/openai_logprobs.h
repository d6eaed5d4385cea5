// Log-probabilities in the shape of an OpenAI answer: /v1/completions' object of parallel
// lists ({tokens, token_logprobs, top_logprobs, text_offset}) or chat's {content: [{token,
// logprob, bytes, top_logprobs}]}.
#ifndef STRATA_SERVICES_ROUTER_HTTP_OPENAI_LOGPROBS_H_
#define STRATA_SERVICES_ROUTER_HTTP_OPENAI_LOGPROBS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "services/router/http/openai_request.h"
#include "services/router/request.h"

namespace strata {

class OpenAiLogprobs {
 public:
  // `top`: the alternatives each token has (chat: exactly these; completions: these and the
  // chosen token, as OpenAI's and vLLM's). `token_text`: a token id's text.
  OpenAiLogprobs(bool chat, int top, std::function<std::string(int32_t)> token_text);

  // Token `id` at byte `offset` of the choice's text, with its log-probabilities (null: none,
  // as an echoed prompt's first token has).
  void Add(int32_t id, const TokenLogprobs* logprobs, size_t offset);
  // What was added since the last Take (for a streamed chunk, or the whole answer).
  Json Take();

 private:
  Json Empty() const;

  bool chat_;
  int top_;
  std::function<std::string(int32_t)> token_text_;
  Json json_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_OPENAI_LOGPROBS_H_
