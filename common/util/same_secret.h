// Comparing a secret a client sent with the one expected, in time that does not tell how much
// of it matched: the cluster token on internal RPCs, the HTTP API's key.
#ifndef STRATA_COMMON_UTIL_SAME_SECRET_H_
#define STRATA_COMMON_UTIL_SAME_SECRET_H_

#include "absl/strings/string_view.h"

namespace strata {

// Equal contents in time that depends on the lengths only.
inline bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_SAME_SECRET_H_
