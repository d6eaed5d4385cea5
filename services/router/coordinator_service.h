// strata.v1.Coordinator: expert workers register here; each gets a connection installed in
// the router's WorkerExpertBackend and learns which experts it owns. Served on the router's
// internal listener only; a registration without the cluster token is refused, so nothing but
// the cluster's own workers can take experts over.
#ifndef STRATA_SERVICES_ROUTER_COORDINATOR_SERVICE_H_
#define STRATA_SERVICES_ROUTER_COORDINATOR_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "common/cluster/cluster_token.h"
#include "common/placement/placement_plan.h"
#include "services/router/shm_expert_connection.h"
#include "services/router/worker_expert_backend.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

struct CoordinatorOptions {
  std::string channel_prefix = "strata";  // shared-memory channels: <prefix>-w<index>-<incarnation>
  int max_tokens_per_step = 512;          // sizes the channel slots
  ExpertCounts calibration;               // [layer][expert] from the plan; may be empty
  // Set when the router runs on a GPU: gives the channel of `request`'s worker its CUDA IPC
  // device buffers, filling `buffers`. Such a router takes only TRANSPORT_CUDA_IPC workers;
  // without it a worker that asks for CUDA IPC gets TRANSPORT_SHARED_MEMORY.
  std::function<absl::StatusOr<std::shared_ptr<ExpertConnection>>(
      const v1::RegisterWorkerRequest& request, std::unique_ptr<ShmExpertConnection> channel,
      v1::CudaIpcBuffers& buffers)>
      cuda_ipc;
  std::string router_device = "cpu";  // for messages
  // The router's GPU (cudaDeviceProp::uuid bytes) when it runs on one: a CUDA IPC worker there
  // shares its memory (WorkerExpertBackend::shares_memory). Empty for a CPU router, whose CPU
  // workers on shared memory share the host's.
  std::string router_gpu_uuid;
  ClusterToken token;  // every registration must carry it
  // A shared-memory worker whose heartbeat stands still this long is declared failed (its
  // experts rerouted); workers beat for every message and while their computation progresses.
  absl::Duration heartbeat_timeout = absl::Milliseconds(1500);
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(const ModelConfig& config, WorkerExpertBackend& experts,
                     CoordinatorOptions options);

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;

  // Registers without gRPC (also what the handler calls).
  absl::Status Register(const v1::RegisterWorkerRequest& request,
                        v1::RegisterWorkerResponse& response);

  // Registrations after each worker's first: the workers that were restarted.
  int64_t restarts() const { return restarts_.load(); }

 private:
  const ModelConfig& config_;
  WorkerExpertBackend& experts_;
  CoordinatorOptions options_;
  std::mutex mu_;
  std::set<uint32_t> registered_;  // worker indexes seen
  std::atomic<int64_t> restarts_{0};
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_COORDINATOR_SERVICE_H_
