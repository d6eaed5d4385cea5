// Unpredictable bytes from the kernel (getrandom), for the names and secrets another local user
// or a network client must not guess: cluster ids and cluster tokens.
#ifndef STRATA_COMMON_CLUSTER_SECURE_RANDOM_H_
#define STRATA_COMMON_CLUSTER_SECURE_RANDOM_H_

#include <string>

#include "absl/status/statusor.h"

namespace strata {

// `bytes` random bytes as 2 * `bytes` lower-case hex digits.
absl::StatusOr<std::string> RandomHex(int bytes);

}  // namespace strata

#endif  // STRATA_COMMON_CLUSTER_SECURE_RANDOM_H_
