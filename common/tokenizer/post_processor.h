// The part of tokenizer.json's post_processor that encoding a single text needs: which special
// token ids go before and after it when special tokens are requested (TemplateProcessing,
// RobertaProcessing, BertProcessing, ByteLevel and Sequence).
#ifndef STRATA_COMMON_TOKENIZER_POST_PROCESSOR_H_
#define STRATA_COMMON_TOKENIZER_POST_PROCESSOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_config.h"

namespace strata {
namespace tokenizer_internal {

struct SpecialTokenFrame {
  std::vector<int32_t> prefix;  // before the text (e.g. <s>)
  std::vector<int32_t> suffix;  // after it (e.g. </s>)
};

// The frame of a single sequence; empty for JSON null.
absl::StatusOr<SpecialTokenFrame> ParsePostProcessor(const Json& json, absl::string_view where);

}  // namespace tokenizer_internal
}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_POST_PROCESSOR_H_
