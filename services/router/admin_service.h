// strata.v1.Admin: a running router's counters (`strata stats`), its hot ratio and KV pool size.
// Served on the router's internal listener only, every call checked for the cluster token.
#ifndef STRATA_SERVICES_ROUTER_ADMIN_SERVICE_H_
#define STRATA_SERVICES_ROUTER_ADMIN_SERVICE_H_

#include "common/cluster/cluster_token.h"
#include "common/engine/step_runner.h"
#include "common/placement/hot_ratio.h"
#include "services/router/scheduler.h"
#include "services/router/worker_expert_backend.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

class AdminService final : public v1::Admin::CallbackService {
 public:
  // `experts` and `hot_ratio` are null when the router runs the experts itself.
  AdminService(Scheduler& scheduler, const PagedKvCache& kv, const StepRunner& runner,
               const WorkerExpertBackend* experts, HotRatioControl* hot_ratio, ClusterToken token)
      : scheduler_(scheduler),
        kv_(kv),
        runner_(runner),
        experts_(experts),
        hot_ratio_(hot_ratio),
        token_(std::move(token)) {}

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;
  grpc::ServerUnaryReactor* SetHotRatio(grpc::CallbackServerContext* context,
                                        const v1::SetHotRatioRequest* request,
                                        v1::SetHotRatioResponse* response) override;
  grpc::ServerUnaryReactor* ResizeKvCache(grpc::CallbackServerContext* context,
                                          const v1::ResizeKvCacheRequest* request,
                                          v1::ResizeKvCacheResponse* response) override;

 private:
  Scheduler& scheduler_;
  const PagedKvCache& kv_;
  const StepRunner& runner_;
  const WorkerExpertBackend* experts_;
  HotRatioControl* hot_ratio_;
  const ClusterToken token_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_ADMIN_SERVICE_H_
