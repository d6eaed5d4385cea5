// How a decode step's row picks its token on the device (DeviceRouter::WriteDecodeInputs): the
// request's sampling settings, its logit transforms with the tokens they touch, and the index
// of the token drawn, which with the seed names the Philox draws (common/util/philox.h) the
// host would take for it.
#ifndef STRATA_COMMON_BACKEND_ROW_SAMPLING_H_
#define STRATA_COMMON_BACKEND_ROW_SAMPLING_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace strata {

// A token a request's logit transforms touch, as of the outputs its list counts.
struct TransformToken {
  static constexpr uint32_t kSeen = 1;      // in the prompt or the output (repetition penalty)
  static constexpr uint32_t kHeldBack = 2;  // not drawn while fewer than min_tokens came
  int32_t token = 0;
  int32_t output_count = 0;
  float bias = 0.0f;
  uint32_t flags = 0;
};

// The most tokens a row's list may hold for the device to apply it (more: the host samples).
inline constexpr int kMaxDeviceTransformTokens = 16384;

struct RowSampling {
  float temperature = 0.0f;  // 0: the arg-max
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;  // the request's generated tokens before this one
  // Transforms first, the host Sampler's: bias, min_tokens, then the penalties.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int min_tokens = 0;
  // The tokens they touch, sorted by token (null: none), counting the outputs before
  // list_step; the outputs from list_step to step (a few: steps in flight) the device has.
  std::shared_ptr<const std::vector<TransformToken>> tokens;
  uint64_t list_step = 0;

  // The arg-max of the model's logits, untransformed: what a row with no RowSampling gets.
  bool plain_argmax() const {
    return temperature == 0.0f && tokens == nullptr && repetition_penalty == 1.0f &&
           presence_penalty == 0.0f && frequency_penalty == 0.0f;
  }
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_ROW_SAMPLING_H_
