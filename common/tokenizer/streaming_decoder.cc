#include "common/tokenizer/streaming_decoder.h"

#include "absl/strings/match.h"

namespace strata {
namespace {

constexpr absl::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::Add(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) return "";
  ids_.push_back(id);
  const std::string text = tokenizer_.DecodeInRange(ids_, skip_special_tokens_);
  // Wait while nothing new decoded, while the end may be an unfinished character (U+FFFD), or
  // while the decoder may still rewrite the end.
  if (text.size() <= prefix_text_.size() || !absl::StartsWith(text, prefix_text_) ||
      absl::EndsWith(text, kReplacementChar) ||
      tokenizer_.DecodeMayChange(ids_, skip_special_tokens_)) {
    return "";
  }
  std::string out = text.substr(prefix_text_.size());
  // The ids just emitted become the context of the next window.
  ids_.erase(ids_.begin(), ids_.begin() + read_);
  read_ = ids_.size();
  prefix_text_ = tokenizer_.DecodeInRange(ids_, skip_special_tokens_);
  return out;
}

std::string StreamingDecoder::Flush() {
  const std::string text = tokenizer_.DecodeInRange(ids_, skip_special_tokens_);
  std::string out;
  if (absl::StartsWith(text, prefix_text_)) out = text.substr(prefix_text_.size());
  ids_.clear();
  read_ = 0;
  prefix_text_.clear();
  return out;
}

}  // namespace strata
