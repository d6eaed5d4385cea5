#include "common/transport/expert_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status ExpertExecutor::Run(const ExpertRequestView& request) {
  if (request.hidden_size != config_.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden size ", request.hidden_size, " does not match the model's ", config_.hidden_size));
  }
  if (request.layer >= static_cast<uint32_t>(config_.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", request.layer, " out of range"));
  }
  const int64_t n = request.num_tokens;
  x_.Resize(n, request.hidden_size);
  std::copy(request.hidden.begin(), request.hidden.end(), x_.data());
  routing_.top_k = static_cast<int>(request.top_k);
  routing_.tokens = n;
  routing_.expert.assign(request.experts.begin(), request.experts.end());
  routing_.weight.assign(request.weights.begin(), request.weights.end());
  return backend_.RunExperts(static_cast<int>(request.layer), x_, routing_, partial_);
}

}  // namespace strata
