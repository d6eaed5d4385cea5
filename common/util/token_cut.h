// Which tokens a sampled draw may pick, defined once for the host's Sampler and the device's
// sampling kernel. Tokens rank by (logit / temperature descending, index ascending); top-k,
// min_p and top-p each keep a prefix of that ranking, so what is kept is one prefix too: the
// tokens whose key is above a cut key, and those on the cut key up to an index. The nucleus
// sums weights p / p_max in fixed point, exact in any order, so the host and the device (and
// any split of the work over threads) find the same cut, and no sort of 150k logits is needed:
// radix passes over the keys find it in linear time.
#ifndef STRATA_COMMON_UTIL_TOKEN_CUT_H_
#define STRATA_COMMON_UTIL_TOKEN_CUT_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/util/philox.h"  // STRATA_HOST_DEVICE

namespace strata {

// Monotone map of floats to unsigned keys (a larger float, a larger key); every NaN maps to 0,
// below every other key, and only NaN does.
STRATA_HOST_DEVICE uint32_t OrderedKey(float f) {
  if (f != f) return 0;
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float whose OrderedKey is `key` (key != 0).
STRATA_HOST_DEVICE float FromOrderedKey(uint32_t key) {
  const uint32_t b = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

// A token's weight p / p_max, in [0, 1], in fixed point: 2^43 leaves room for 2^20 tokens of
// weight 1 in 64 bits. Scaling by a power of two is exact; the fraction below 2^-43 is dropped.
inline constexpr int kMassFractionBits = 43;
STRATA_HOST_DEVICE uint64_t FixedMass(float weight) {
  return static_cast<uint64_t>(weight * static_cast<float>(uint64_t{1} << kMassFractionBits));
}

// The mass a nucleus must reach: top_p of `total`, rounded up, at least 1 and at most total.
STRATA_HOST_DEVICE uint64_t NucleusTarget(float top_p, uint64_t total) {
  const double want = ceil(static_cast<double>(top_p) * static_cast<double>(total));
  const uint64_t target = want >= static_cast<double>(total) ? total : static_cast<uint64_t>(want);
  return target < 1 ? 1 : target;
}

// The kept prefix: a token is kept when its key is above `key`, or equal to it with an index
// of at most `last_index`. Tokens failing the min_p test (their weight against the largest,
// x0, below min_p) and NaNs are never kept.
struct TokenCut {
  uint32_t key = 0;
  int32_t last_index = INT32_MAX;
  float x0 = 0.0f;  // the largest logit / temperature
  float min_p = 0.0f;
};

// Whether a token with key `key` (not NaN) at `index` is within the cut's prefix.
STRATA_HOST_DEVICE bool InCut(uint32_t key, int32_t index, const TokenCut& cut) {
  return key > cut.key || (key == cut.key && index <= cut.last_index);
}

// Whether the token with scaled logit x (logit / temperature) at `index` is kept.
STRATA_HOST_DEVICE bool Kept(float x, int32_t index, const TokenCut& cut) {
  const uint32_t key = OrderedKey(x);
  if (key == 0 || !InCut(key, index, cut)) return false;
  return !(cut.min_p > 0.0f) || expf(x - cut.x0) >= cut.min_p;
}

// The Gumbel-max score of a kept token: the arg-max of x - log(-log(u)) over the kept tokens
// (ties to the lower index) is an exact draw from their softmax. u: the token's uniform.
STRATA_HOST_DEVICE float GumbelScore(float x, float u) { return x - logf(-logf(u)); }

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_TOKEN_CUT_H_
