#include "common/cluster/cluster_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster/secure_random.h"
#include "common/util/same_secret.h"

namespace strata {
namespace {

constexpr size_t kMinSecret = 32;
constexpr size_t kMaxSecret = 1024;

}  // namespace

absl::StatusOr<ClusterToken> ClusterToken::FromSecret(std::string secret) {
  if (secret.size() < kMinSecret || secret.size() > kMaxSecret) {
    return absl::InvalidArgumentError(absl::StrCat("a cluster token has ", kMinSecret, "..",
                                                   kMaxSecret, " characters, this one ",
                                                   secret.size()));
  }
  for (char c : secret) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("a cluster token is printable ASCII without spaces");
    }
  }
  return ClusterToken(std::move(secret));
}

absl::StatusOr<ClusterToken> ClusterToken::FromFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cluster token file ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string text;
  absl::Status status;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("cluster token file ", path, " is not a regular file"));
  } else if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    status = absl::PermissionDeniedError(absl::StrFormat(
        "cluster token file %s belongs to uid %d with mode %04o; it must be this user's "
        "(uid %d) and readable by nobody else (chmod 600)",
        path, st.st_uid, st.st_mode & 07777, ::geteuid()));
  } else {
    char buffer[kMaxSecret + 64];
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      status = absl::InternalError(absl::StrCat("cluster token file ", path, ": read failed"));
    } else {
      text.assign(buffer, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  absl::StatusOr<ClusterToken> token = FromSecret(std::string(absl::StripAsciiWhitespace(text)));
  if (!token.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster token file ", path, ": ", token.status().message()));
  }
  return token;
}

absl::StatusOr<ClusterToken> ClusterToken::Create(const std::string& path) {
  absl::StatusOr<std::string> secret = RandomHex(32);
  if (!secret.ok()) return secret.status();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the cluster token file ", path, ": ", std::strerror(errno)));
  }
  const std::string line = *secret + "\n";
  const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!written) {
    ::unlink(path.c_str());
    return absl::InternalError(absl::StrCat("cannot write the cluster token file ", path));
  }
  return ClusterToken(*std::move(secret));
}

absl::StatusOr<ClusterToken> ClusterToken::FromFileOrEnvironment(const std::string& file) {
  if (!file.empty()) return FromFile(file);
  const char* env = std::getenv(kEnvironment);
  if (env == nullptr || *env == '\0') return ClusterToken();
  absl::StatusOr<ClusterToken> token = FromSecret(std::string(absl::StripAsciiWhitespace(env)));
  if (!token.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("$", kEnvironment, ": ", token.status().message()));
  }
  return token;
}

void ClusterToken::Attach(grpc::ClientContext& context) const {
  if (!secret_.empty()) context.AddMetadata(kMetadataKey, secret_);
}

absl::Status ClusterToken::Check(const grpc::CallbackServerContext& context) const {
  if (secret_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(kMetadataKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "this is a cluster-internal service: the call carries no cluster token (x-strata-cluster-"
        "token); clients use the Generation service on the client port");
  }
  if (!SameSecret(absl::string_view(it->second.data(), it->second.size()), secret_)) {
    return absl::UnauthenticatedError("the call's cluster token is not this cluster's");
  }
  return absl::OkStatus();
}

absl::Status CheckInternalListener(const std::string& what, const std::string& address,
                                   const ClusterToken& token) {
  if (address.rfind("unix:", 0) == 0 || !token.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " on TCP (", address, ") needs a cluster token (--cluster-token-file or $",
                   ClusterToken::kEnvironment, "): anyone who reaches the port could use it"));
}

}  // namespace strata
