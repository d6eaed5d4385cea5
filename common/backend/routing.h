// How one token's gate logits choose its experts and weigh them: the rules of every
// GateScoring, defined once for the CPU backend and as the reference the GPU gate kernels
// are tested against.
#ifndef STRATA_COMMON_BACKEND_ROUTING_H_
#define STRATA_COMMON_BACKEND_ROUTING_H_

#include <cstdint>

#include "common/model/model_config.h"

namespace strata {

// Writes the config.top_k experts of one token and their weights from its config.num_experts
// gate logits, which it overwrites (divided by `temperature`, then scored). Ties go to the
// lower expert id. `correction_bias` (num_experts values, or null) is added to sigmoid scores
// for choosing only (kSigmoidGrouped).
void SelectExperts(const ModelConfig& config, float* logits, float temperature,
                   const float* correction_bias, int32_t* experts, float* weights);

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_ROUTING_H_
