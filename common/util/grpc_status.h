// absl::Status to grpc::Status, for gRPC handlers (the only place grpc::Status is made).
#ifndef STRATA_COMMON_UTIL_GRPC_STATUS_H_
#define STRATA_COMMON_UTIL_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"

namespace strata {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_GRPC_STATUS_H_
