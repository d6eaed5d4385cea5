// Tokenize and Detokenize as every client API answers them (gRPC Generation, the HTTP API's
// /tokenize and /detokenize): one set of rules, so that the two cannot drift apart.
#ifndef STRATA_SERVICES_ROUTER_TOKENIZATION_H_
#define STRATA_SERVICES_ROUTER_TOKENIZATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/scheduler.h"

namespace strata {

// The ids of `text`. FAILED_PRECONDITION without a tokenizer (`tokenizer` null);
// INVALID_ARGUMENT for text longer than any sequence could hold (Scheduler::CheckTextFits) or
// not UTF-8.
absl::StatusOr<std::vector<int32_t>> TokenizeText(const Tokenizer* tokenizer,
                                                  const Scheduler& scheduler,
                                                  absl::string_view text, bool add_special_tokens);

// The text of `ids`. FAILED_PRECONDITION without a tokenizer; INVALID_ARGUMENT for more ids
// than the context holds or an id outside the tokenizer's vocabulary (naming it and its
// position).
absl::StatusOr<std::string> DetokenizeIds(const Tokenizer* tokenizer, const Scheduler& scheduler,
                                          absl::Span<const int64_t> ids, bool skip_special_tokens);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_TOKENIZATION_H_
