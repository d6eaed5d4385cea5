// Expert-channel messages for tests (common/transport/expert_wire.h).
#ifndef STRATA_TESTS_TESTING_EXPERT_MESSAGES_H_
#define STRATA_TESTS_TESTING_EXPERT_MESSAGES_H_

#include <cstdint>

#include "absl/types/span.h"
#include "common/transport/expert_wire.h"

namespace strata::testing {

// A host run request over the caller's arrays (the view points into them): the token count
// and top_k follow from their lengths.
inline ExpertRequestView HostRunRequest(uint64_t step, uint32_t layer, uint32_t hidden_size,
                                        absl::Span<const float> hidden,
                                        absl::Span<const int32_t> experts,
                                        absl::Span<const float> weights) {
  ExpertRequestView r;
  r.step = step;
  r.layer = layer;
  r.hidden_size = hidden_size;
  r.num_tokens = static_cast<uint32_t>(hidden.size() / hidden_size);
  r.top_k = r.num_tokens == 0 ? 0 : static_cast<uint32_t>(experts.size() / r.num_tokens);
  r.hidden = hidden;
  r.experts = experts;
  r.weights = weights;
  return r;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_EXPERT_MESSAGES_H_
