#include "common/util/grpc_listen.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Whether binding `host`:`port` fails with EADDRINUSE (gRPC's own error goes to its log only).
bool PortInUse(std::string host, const std::string& port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0) {
    return false;
  }
  bool in_use = false;
  for (addrinfo* a = found; a != nullptr && !in_use; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;  // as gRPC binds: a port in TIME_WAIT is free, a listening one is not
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    in_use = ::bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return in_use;
}

}  // namespace

absl::StatusOr<ListeningServer> StartListening(grpc::ServerBuilder& builder,
                                               const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) {
    const std::string path = listen.substr(5);
    if (path.empty() || path.size() > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot listen on ", listen, ": a socket path of 1..100 characters"));
    }
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials());
    ListeningServer result;
    result.server = builder.BuildAndStart();
    if (result.server == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
    }
    // Its directory keeps others out already; the socket itself says so too.
    ::chmod(path.c_str(), 0600);
    result.address = listen;
    return result;
  }
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", listen, ": not HOST:PORT"));
  }
  const std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &bound);
  ListeningServer result;
  result.server = builder.BuildAndStart();
  if (result.server == nullptr || bound == 0) {
    if (result.server != nullptr) result.server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, PortInUse(host, port) ? ": port in use" : ""));
  }
  result.address = absl::StrCat(host, ":", bound);
  return result;
}

}  // namespace strata
