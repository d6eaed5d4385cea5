// strata.v1.ExpertWorker: the per-layer exchange over a gRPC stream, for a router on another
// host (on one host the shared-memory channel carries it instead).
#ifndef STRATA_SERVICES_EXPERT_WORKER_EXPERT_WORKER_SERVICE_H_
#define STRATA_SERVICES_EXPERT_WORKER_EXPERT_WORKER_SERVICE_H_

#include <mutex>

#include "common/cluster/cluster_token.h"
#include "services/expert-worker/worker_executor.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

class ExpertWorkerService final : public v1::ExpertWorker::CallbackService {
 public:
  // Requests from all streams run one at a time on `executor`, under `executor_mu`. A stream
  // without the cluster token is refused.
  ExpertWorkerService(WorkerExecutor& executor, std::mutex& executor_mu, ClusterToken token)
      : executor_(executor), executor_mu_(executor_mu), token_(std::move(token)) {}

  grpc::ServerBidiReactor<v1::ExpertRequest, v1::ExpertResponse>* Exchange(
      grpc::CallbackServerContext* context) override;

 private:
  WorkerExecutor& executor_;
  std::mutex& executor_mu_;
  const ClusterToken token_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_WORKER_EXPERT_WORKER_SERVICE_H_
