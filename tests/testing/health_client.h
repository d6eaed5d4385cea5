// The standard gRPC health service of a cluster's router, as the cluster tests ask it.
// Needs strata_health_proto.
#ifndef STRATA_TESTS_TESTING_HEALTH_CLIENT_H_
#define STRATA_TESTS_TESTING_HEALTH_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "grpc_health/v1/health.grpc.pb.h"
#include "tests/testing/poll.h"

namespace strata::testing {

using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
inline constexpr ServingStatus kServing = grpc::health::v1::HealthCheckResponse::SERVING;
inline constexpr ServingStatus kNotServing = grpc::health::v1::HealthCheckResponse::NOT_SERVING;

// The health of `service` ("" for the server as a whole) at `address`; UNKNOWN if the check
// fails (5 s deadline).
inline ServingStatus Health(const std::string& address, const std::string& service = "") {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// Whether the server at `address` as a whole is SERVING.
inline bool Serving(const std::string& address) {
  return Health(address) == grpc::health::v1::HealthCheckResponse::SERVING;
}

// Whether the server's health became `want` within `timeout_s` (checked every 50 ms).
inline bool WaitForHealth(const std::string& address, ServingStatus want, int timeout_s = 30) {
  return PollUntil([&] { return Health(address) == want; }, std::chrono::seconds(timeout_s));
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_HEALTH_CLIENT_H_
