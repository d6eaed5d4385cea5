// A logit row's log-probabilities as requests ask for them: the chosen token's, and the most
// likely tokens' (OpenAI's logprobs and top_logprobs, vLLM's prompt_logprobs).
#ifndef STRATA_SERVICES_ROUTER_TOKEN_LOGPROBS_H_
#define STRATA_SERVICES_ROUTER_TOKEN_LOGPROBS_H_

#include <cstdint>

#include "services/router/request.h"

namespace strata {

// log softmax(row)[target], and the `top` most likely tokens with theirs (most likely first,
// ties by lower id; at most the vocabulary). One pass finds the maximum and keeps the best `top`
// in a small heap (no sort of the vocabulary), one sums the exponentials in double (stable over
// a large vocabulary).
TokenLogprobs LogprobsAt(const float* row, int64_t vocab, int32_t target, int top);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_TOKEN_LOGPROBS_H_
