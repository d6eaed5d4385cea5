// Client requests taken as raw bytes and parsed here, so that every request that cannot be used
// is answered INVALID_ARGUMENT with a message: a `string` field that is not UTF-8 (which makes
// protobuf's own parse fail, log an ERROR, and gRPC answer UNIMPLEMENTED with no message) names
// the field; bytes that are not the message at all say so. Nothing is logged.
#ifndef STRATA_SERVICES_ROUTER_CLIENT_REQUEST_H_
#define STRATA_SERVICES_ROUTER_CLIENT_REQUEST_H_

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

// INVALID_ARGUMENT naming the first field of `descriptor` (nested messages too) whose value in
// the wire bytes `wire` is a string that is not well-formed UTF-8, or saying that `wire` is not
// a protobuf message; OK otherwise.
absl::Status CheckUtf8Fields(const google::protobuf::Descriptor& descriptor,
                             absl::string_view wire);

// The request in `buffer` as `message`, checked as above.
absl::Status ParseClientRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message& message);

// `message` serialized into `buffer` (INTERNAL if it cannot be).
absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer& buffer);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_CLIENT_REQUEST_H_
