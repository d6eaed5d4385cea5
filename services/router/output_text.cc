#include "services/router/output_text.h"

#include <algorithm>

namespace strata {

OutputText::OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop,
                       bool skip_special_tokens, bool include_stop)
    : stop_(std::move(stop)), include_stop_(include_stop) {
  if (tokenizer != nullptr) {
    decoder_ = std::make_unique<StreamingDecoder>(*tokenizer, skip_special_tokens);
  }
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
}

OutputText::Update OutputText::Add(int32_t id, bool match_stop) {
  Update update;
  if (decoder_ == nullptr) return update;
  pending_ += decoder_->Add(id);
  // The earliest complete stop string ends the output (the longest of those starting there).
  size_t first = std::string::npos, length = 0;
  for (const std::string& s : stop_) {
    const size_t at = match_stop ? pending_.find(s) : std::string::npos;
    if (at < first || (at == first && at != std::string::npos && s.size() > length)) {
      first = at;
      length = s.size();
    }
  }
  if (first != std::string::npos) {
    update.text = pending_.substr(0, first + (include_stop_ ? length : 0));
    update.stopped = true;
    pending_.clear();
    return update;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  update.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return update;
}

std::string OutputText::Flush() {
  if (decoder_ == nullptr) return "";
  std::string rest = pending_ + decoder_->Flush();
  pending_.clear();
  return rest;
}

}  // namespace strata
