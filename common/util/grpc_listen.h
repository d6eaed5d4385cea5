// Starting a gRPC server on an address of its own: gRPC turns SO_REUSEPORT on by default, so a
// second server on a port another process serves would share it (and its clients) silently.
#ifndef STRATA_COMMON_UTIL_GRPC_LISTEN_H_
#define STRATA_COMMON_UTIL_GRPC_LISTEN_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

struct ListeningServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // HOST:PORT, the port the one bound when 0 was asked for; or unix:PATH
};

// Adds `listen` (HOST:PORT, port 0 picks a free one; or unix:PATH, a socket of mode 0600) to
// `builder` with port reuse off and starts the server. UNAVAILABLE "cannot listen on HOST:PORT:
// port in use" when another socket holds the port, and "cannot listen on HOST:PORT" for anything
// else.
absl::StatusOr<ListeningServer> StartListening(grpc::ServerBuilder& builder,
                                               const std::string& listen);

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_GRPC_LISTEN_H_
