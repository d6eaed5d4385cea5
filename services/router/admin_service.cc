#include "services/router/admin_service.h"

#include <algorithm>

#include "common/transport/tier_counters_proto.h"
#include "services/router/generation_service.h"

namespace strata {

grpc::ServerUnaryReactor* AdminService::Stats(grpc::CallbackServerContext* context,
                                              const v1::StatsRequest* request,
                                              v1::StatsResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status allowed = token_.Check(*context); !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  const Scheduler::Stats s = scheduler_.stats();
  response->set_waiting_requests(static_cast<uint32_t>(s.waiting));
  response->set_running_requests(static_cast<uint32_t>(s.running));
  response->set_free_kv_blocks(static_cast<uint32_t>(s.free_kv_blocks));
  response->set_total_kv_blocks(static_cast<uint32_t>(scheduler_.kv_pool_blocks()));
  response->set_kv_blocks_borrowed(static_cast<uint32_t>(scheduler_.kv_borrowed_blocks()));
  response->set_steps(static_cast<uint64_t>(s.steps));
  response->set_preemptions(static_cast<uint64_t>(s.preemptions));
  response->set_graph_steps(static_cast<uint64_t>(s.graph_steps));
  response->set_graph_replay_us(s.graph_replay_us);
  response->set_graph_between_us(s.graph_between_us);
  response->set_graph_overlapped_steps(static_cast<uint64_t>(s.overlapped_steps));
  response->set_eager_step_trials(static_cast<uint64_t>(s.replay_or_eager.trials));
  response->set_eager_step_switches(static_cast<uint64_t>(s.replay_or_eager.switches));
  response->set_eager_steps_preferred(s.replay_or_eager.eager);
  response->set_prefix_cache_queried_tokens(static_cast<uint64_t>(s.prefix_queried_tokens));
  response->set_prefix_cache_hit_tokens(static_cast<uint64_t>(s.prefix_hit_tokens));
  response->set_prefix_cache_blocks(static_cast<uint64_t>(s.prefix_cached_blocks));
  response->set_draft_tokens(static_cast<uint64_t>(s.draft_tokens));
  response->set_accepted_draft_tokens(static_cast<uint64_t>(s.accepted_draft_tokens));
  response->set_draft_steps(static_cast<uint64_t>(s.draft_steps));
  response->set_speculation_turned_off(static_cast<uint64_t>(s.speculation_turned_off));
  response->set_kv_cache_dtype(kv_.options().fp8() ? "fp8" : "16-bit");
  response->set_kv_scales_calibrated(s.kv_scales_ready);
  const RequestMetrics::Totals t = scheduler_.metrics().totals();
  response->set_requests_finished(static_cast<uint64_t>(t.requests));
  response->set_prompt_tokens(static_cast<uint64_t>(t.prompt_tokens));
  response->set_generated_tokens(static_cast<uint64_t>(t.generated_tokens));
  response->set_mean_ttft_ms(t.mean_ttft_ms());
  response->set_mean_inter_token_ms(t.mean_inter_token_ms());
  response->set_uptime_s(absl::ToDoubleSeconds(scheduler_.metrics().uptime()));
  if (experts_ != nullptr) {
    response->set_reroutes(static_cast<uint64_t>(experts_->reroutes()));
    response->set_expert_wire_bytes_sent(experts_->wire_bytes().sent.load());
    response->set_expert_wire_bytes_received(experts_->wire_bytes().received.load());
    response->set_expert_activations(experts_->fp8_activations() ? "fp8" : "f32");
    for (int w = 0; w < experts_->num_workers(); ++w) {
      v1::WorkerStats* worker = response->add_workers();
      worker->set_index(static_cast<uint32_t>(w));
      worker->set_connected(experts_->connected(w));
      TierCountersToProto(experts_->tiers(w), *worker->mutable_tiers());
      if (const std::optional<WorkerFailure> failure = experts_->failure(w)) {
        worker->set_failure(failure->reason);
        worker->set_stalled(failure->stalled);
        worker->set_failed_for_s(absl::ToDoubleSeconds(absl::Now() - failure->since));
      }
    }
  }
  if (hot_ratio_ != nullptr) {
    response->set_hot_ratio(hot_ratio_->current());
    response->set_hot_ratio_automatic(hot_ratio_->automatic());
  }
  const RouterBackend::PredictionCounts p = runner_.prefetch();
  response->set_prefetch_predicted(p.predicted);
  response->set_prefetch_correct(p.correct);
  response->set_prefetch_actual(p.actual);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::SetHotRatio(grpc::CallbackServerContext* context,
                                                    const v1::SetHotRatioRequest* request,
                                                    v1::SetHotRatioResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status allowed = token_.Check(*context); !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  if (hot_ratio_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "this router runs its experts itself: there are no tiers"));
    return reactor;
  }
  absl::Status status;
  if (request->automatic()) {
    hot_ratio_->SetAutomatic();
  } else {
    status = hot_ratio_->SetFixed(request->hot_ratio());
  }
  // The workers take it with their next request.
  response->set_hot_ratio(hot_ratio_->current());
  response->set_automatic(hot_ratio_->automatic());
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ResizeKvCache(grpc::CallbackServerContext* context,
                                                      const v1::ResizeKvCacheRequest* request,
                                                      v1::ResizeKvCacheResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status allowed = token_.Check(*context); !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  if (kv_.options().initial_blocks > 0) {
    // The pool follows the memory the workers lend; a size set here would be undone at once.
    reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError(
        "the KV pool's size follows the memory the workers lend (kv_cache.share_expert_memory)")));
    return reactor;
  }
  // Finished from the engine thread once the resize ran between steps.
  scheduler_.ResizeKv(static_cast<int>(std::min<uint32_t>(request->blocks(), 1u << 30)),
                      [reactor, response](absl::StatusOr<Scheduler::KvResize> result) {
                        if (result.ok()) {
                          response->set_blocks(static_cast<uint32_t>(result->blocks));
                          response->set_moved_blocks(static_cast<uint32_t>(result->moved_blocks));
                          response->set_millis(result->millis);
                        }
                        reactor->Finish(ToGrpcStatus(result.status()));
                      });
  return reactor;
}

}  // namespace strata
