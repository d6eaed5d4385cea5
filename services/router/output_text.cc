#include "services/router/output_text.h"

#include <algorithm>

namespace strata {

OutputText::OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop)
    : stop_(std::move(stop)) {
  if (tokenizer != nullptr)
    decoder_ = std::make_unique<StreamingDecoder>(*tokenizer, /*skip_special_tokens=*/true);
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
}

OutputText::Update OutputText::Add(int32_t id) {
  Update update;
  if (decoder_ == nullptr) return update;
  pending_ += decoder_->Add(id);
  // The earliest complete stop string ends the output.
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    update.text = pending_.substr(0, first);
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
