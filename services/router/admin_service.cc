#include "services/router/admin_service.h"

namespace strata {

grpc::ServerUnaryReactor* AdminService::Stats(grpc::CallbackServerContext* context,
                                              const v1::StatsRequest* request,
                                              v1::StatsResponse* response) {
  const Scheduler::Stats s = scheduler_.stats();
  response->set_waiting_requests(static_cast<uint32_t>(s.waiting));
  response->set_running_requests(static_cast<uint32_t>(s.running));
  response->set_free_kv_blocks(static_cast<uint32_t>(s.free_kv_blocks));
  response->set_total_kv_blocks(static_cast<uint32_t>(kv_.options().num_blocks));
  response->set_steps(static_cast<uint64_t>(s.steps));
  response->set_preemptions(static_cast<uint64_t>(s.preemptions));
  if (experts_ != nullptr) {
    response->set_reroutes(static_cast<uint64_t>(experts_->reroutes()));
    for (int w = 0; w < experts_->num_workers(); ++w) {
      v1::WorkerStats* worker = response->add_workers();
      worker->set_index(static_cast<uint32_t>(w));
      worker->set_connected(experts_->connected(w));
    }
  }
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace strata
