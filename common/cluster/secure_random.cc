#include "common/cluster/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<std::string> RandomHex(int bytes) {
  if (bytes <= 0 || bytes > 256) return absl::InvalidArgumentError("RandomHex: 1..256 bytes");
  std::vector<char> raw(bytes);
  size_t filled = 0;
  while (filled < raw.size()) {
    const ssize_t n = ::getrandom(raw.data() + filled, raw.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(raw.data(), raw.size()));
}

}  // namespace strata
