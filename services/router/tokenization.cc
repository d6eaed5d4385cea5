#include "services/router/tokenization.h"

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

absl::Status NoTokenizer() {
  return absl::FailedPreconditionError(
      "this model has no tokenizer (tokenizer.json or tiktoken.model)");
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> TokenizeText(const Tokenizer* tokenizer,
                                                  const Scheduler& scheduler,
                                                  absl::string_view text, bool add_special_tokens) {
  if (tokenizer == nullptr) return NoTokenizer();
  // Bounded like a prompt: no text is tokenized that could not be one.
  RETURN_IF_ERROR(scheduler.CheckTextFits("the text", text.size(), false));
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, add_special_tokens);
  if (!ids.ok()) return absl::InvalidArgumentError(ids.status().message());
  return ids;
}

absl::StatusOr<std::string> DetokenizeIds(const Tokenizer* tokenizer, const Scheduler& scheduler,
                                          absl::Span<const int64_t> ids, bool skip_special_tokens) {
  if (tokenizer == nullptr) return NoTokenizer();
  // No more than a sequence holds: its text is what a client may ask for.
  if (static_cast<int64_t>(ids.size()) > scheduler.max_context_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " token ids; at most the context's ",
                                                   scheduler.max_context_tokens(),
                                                   " are detokenized at once"));
  }
  std::vector<int32_t> in_range;
  in_range.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tokenizer->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     tokenizer->vocab_size(), ")"));
    }
    in_range.push_back(static_cast<int32_t>(ids[i]));
  }
  absl::StatusOr<std::string> text = tokenizer->Decode(in_range, skip_special_tokens);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  return text;
}

}  // namespace strata
