// How a decode step's row draws its token on the device (DeviceRouter::WriteDecodeInputs): the
// request's sampling settings and the index of the token drawn, which with the seed names the
// Philox draws (common/util/philox.h) the host would take for it.
#ifndef STRATA_COMMON_BACKEND_ROW_SAMPLING_H_
#define STRATA_COMMON_BACKEND_ROW_SAMPLING_H_

#include <cstdint>

namespace strata {

struct RowSampling {
  float temperature = 0.0f;  // 0: the arg-max
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;  // the request's generated tokens before this one
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_ROW_SAMPLING_H_
