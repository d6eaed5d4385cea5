// strata.v1.Coordinator: expert workers register here; each gets a connection installed in
// the router's RemoteExpertBackend and learns which experts it owns.
#ifndef STRATA_SERVICES_ROUTER_COORDINATOR_SERVICE_H_
#define STRATA_SERVICES_ROUTER_COORDINATOR_SERVICE_H_

#include <string>

#include "common/placement/placement_plan.h"
#include "services/router/remote_expert_backend.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

struct CoordinatorOptions {
  std::string channel_prefix = "strata";  // shared-memory channels: <prefix>-w<index>-<incarnation>
  int max_tokens_per_step = 512;          // sizes the channel slots
  ExpertCounts calibration;               // [layer][expert] from the plan; may be empty
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(const ModelConfig& config, RemoteExpertBackend& experts,
                     CoordinatorOptions options);

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;

  // Registers without gRPC (also what the handler calls).
  absl::Status Register(const v1::RegisterWorkerRequest& request,
                        v1::RegisterWorkerResponse& response);

 private:
  const ModelConfig& config_;
  RemoteExpertBackend& experts_;
  CoordinatorOptions options_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_COORDINATOR_SERVICE_H_
