// Rotary position embedding tables (default and YaRN), as Hugging Face transformers builds
// them: shared by every backend so all compute the same angles.
#ifndef STRATA_COMMON_BACKEND_ROPE_H_
#define STRATA_COMMON_BACKEND_ROPE_H_

#include <vector>

#include "common/model/model_config.h"

namespace strata {

struct RopeTable {
  std::vector<float> inv_freq;     // head_dim / 2 frequencies
  float attention_scaling = 1.0f;  // multiplies cos and sin (YaRN's mscale)
};

// `rotary_dim` is the number of dimensions turned: the head's, or fewer (partial rotary,
// ModelConfig::rotary_dim), as transformers builds the frequencies for that width.
RopeTable BuildRopeTable(const RopeConfig& rope, int rotary_dim);

// Rotates the first rotary_dim dimensions of one head in place: x[j], x[j + rotary_dim/2]
// rotate by position * inv_freq[j] (the "rotate_half" convention), scaled by
// attention_scaling; dimensions past rotary_dim are left as they are.
void ApplyRope(const RopeTable& table, int64_t position, float* x, int rotary_dim);

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_ROPE_H_
