// strata.v1.Admin: a running router's counters (`strata stats`).
#ifndef STRATA_SERVICES_ROUTER_ADMIN_SERVICE_H_
#define STRATA_SERVICES_ROUTER_ADMIN_SERVICE_H_

#include "services/router/remote_expert_backend.h"
#include "services/router/scheduler.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

class AdminService final : public v1::Admin::CallbackService {
 public:
  // `experts` is null when the router runs the experts itself.
  AdminService(const Scheduler& scheduler, const PagedKvCache& kv,
               const RemoteExpertBackend* experts)
      : scheduler_(scheduler), kv_(kv), experts_(experts) {}

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;

 private:
  const Scheduler& scheduler_;
  const PagedKvCache& kv_;
  const RemoteExpertBackend* experts_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_ADMIN_SERVICE_H_
