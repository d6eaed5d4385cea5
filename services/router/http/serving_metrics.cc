#include "services/router/http/serving_metrics.h"

#include "absl/strings/str_cat.h"

namespace strata {

const char* OutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kSuccess:
      return "success";
    case RequestOutcome::kInvalid:
      return "invalid";
    case RequestOutcome::kRejected:
      return "rejected";
    case RequestOutcome::kCancelled:
      return "cancelled";
    case RequestOutcome::kError:
      return "error";
    case RequestOutcome::kCount:
      break;
  }
  return "unknown";
}

std::string RenderMetrics(const ServingMetrics& s, const RequestMetrics& requests,
                          const RouterSnapshot& r) {
  MetricsWriter w;
  for (int i = 0; i < static_cast<int>(RequestOutcome::kCount); ++i) {
    w.Counter("strata_requests_total", "HTTP API generation requests by how they ended",
              static_cast<double>(s.requests[i].load()),
              {{"outcome", OutcomeName(static_cast<RequestOutcome>(i))}});
  }
  const RequestMetrics::Totals totals = requests.totals();
  w.Counter("strata_requests_finished_total", "Requests finished, through any API",
            static_cast<double>(totals.requests));
  w.Counter("strata_prompt_tokens_total", "Prompt tokens of the finished requests",
            static_cast<double>(totals.prompt_tokens));
  w.Counter("strata_generated_tokens_total", "Tokens generated, for every request",
            static_cast<double>(totals.tokens_so_far));
  w.Histogram("strata_time_to_first_token_seconds",
              "From a request's arrival to its first generated token",
              requests.time_to_first_token().snapshot());
  w.Histogram("strata_inter_token_latency_seconds", "Between a request's successive tokens",
              requests.inter_token_latency().snapshot());
  w.Gauge("strata_requests_waiting", "Requests queued for admission", r.waiting);
  w.Gauge("strata_requests_running", "Sequences in the running batch", r.running);
  w.Gauge("strata_kv_blocks_capacity", "Blocks of the paged KV cache", r.kv_blocks_total);
  w.Gauge("strata_kv_blocks_used", "KV-cache blocks held by sequences",
          r.kv_blocks_total - r.kv_blocks_free);
  w.Gauge("strata_kv_blocks_borrowed",
          "KV-cache blocks in memory the workers lent (kv_cache.share_expert_memory)",
          r.kv_blocks_borrowed);
  w.Counter("strata_steps_total", "Forward steps run", static_cast<double>(r.steps));
  w.Counter("strata_graph_steps_total", "Forward steps run by CUDA graph replay",
            static_cast<double>(r.graph_steps));
  w.Counter("strata_eager_step_trials_total",
            "Decode steps of a batch size timed eagerly against replays, trials decided",
            static_cast<double>(r.replay_or_eager.trials));
  w.Counter("strata_eager_step_switches_total",
            "Changes of the way a batch size's decode steps run (replayed or eager)",
            static_cast<double>(r.replay_or_eager.switches));
  w.Gauge("strata_eager_steps_preferred",
          "Whether some batch size's decode steps run eagerly, found faster than replays",
          r.replay_or_eager.eager ? 1 : 0);
  w.Counter("strata_preemptions_total", "Sequences preempted for KV blocks (later recomputed)",
            static_cast<double>(r.preemptions));
  w.Counter("strata_prompt_tokens_computed_total",
            "Prompt positions whose keys and values steps computed (cached prefixes and the "
            "other samples of a request with n > 1 cost none; a preempted request's again)",
            static_cast<double>(r.prompt_tokens_computed));
  w.Counter("strata_prefix_cache_queried_tokens_total",
            "Prompt tokens looked up in the prefix cache at admission",
            static_cast<double>(r.prefix_queried_tokens));
  w.Counter("strata_prefix_cache_hit_tokens_total",
            "Prompt tokens whose keys and values were found cached",
            static_cast<double>(r.prefix_hit_tokens));
  w.Gauge("strata_prefix_cache_blocks", "Full KV blocks registered in the prefix cache",
          static_cast<double>(r.prefix_cached_blocks));
  w.Counter("strata_draft_tokens_total", "Tokens drafted by prompt lookup (speculative decoding)",
            static_cast<double>(r.draft_tokens));
  w.Counter("strata_accepted_draft_tokens_total", "Drafted tokens the model's step accepted",
            static_cast<double>(r.accepted_draft_tokens));
  w.Counter("strata_worker_restarts_total",
            "Workers that registered again after their first registration",
            static_cast<double>(r.worker_restarts));
  w.Counter("strata_reroutes_total", "Layers run again around a failed worker",
            static_cast<double>(r.reroutes));
  w.Counter("strata_expert_wire_bytes_sent_total",
            "Bytes of per-layer expert requests sent to gRPC-transport workers",
            static_cast<double>(r.expert_wire_bytes_sent));
  w.Counter("strata_expert_wire_bytes_received_total",
            "Bytes of per-layer expert responses received from gRPC-transport workers",
            static_cast<double>(r.expert_wire_bytes_received));
  w.Counter("strata_prefetch_predicted_total", "Experts predicted for the next layer",
            static_cast<double>(r.prefetch_predicted));
  w.Counter("strata_prefetch_correct_total", "Predicted experts the gate then picked",
            static_cast<double>(r.prefetch_correct));
  w.Counter("strata_prefetch_actual_total", "Experts the gate picked (where predicted)",
            static_cast<double>(r.prefetch_actual));
  for (const auto& worker : r.workers) {
    w.Gauge("strata_worker_connected", "Whether the worker is registered", worker.connected ? 1 : 0,
            {{"worker", absl::StrCat(worker.index)}});
  }
  for (const auto& worker : r.workers) {
    const std::string index = absl::StrCat(worker.index);
    w.Counter("strata_worker_tier_hits_total", "Expert uses served from a tier, per worker",
              static_cast<double>(worker.hot_hits), {{"worker", index}, {"tier", "hot"}});
    w.Counter("strata_worker_tier_hits_total", "", static_cast<double>(worker.warm_hits),
              {{"worker", index}, {"tier", "warm"}});
  }
  for (const auto& worker : r.workers) {
    w.Counter("strata_worker_tier_misses_total",
              "Expert uses not resident (cold: copied in or computed by strata-expert-store)",
              static_cast<double>(worker.misses), {{"worker", absl::StrCat(worker.index)}});
  }
  for (const auto& worker : r.workers) {
    w.Counter("strata_worker_prefetch_loads_total", "Experts a worker loaded ahead on a hint",
              static_cast<double>(worker.prefetch_loads), {{"worker", absl::StrCat(worker.index)}});
  }
  for (const auto& worker : r.workers) {
    w.Counter("strata_worker_prefetch_hits_total", "Prefetched experts then used",
              static_cast<double>(worker.prefetch_hits), {{"worker", absl::StrCat(worker.index)}});
  }
  for (const auto& worker : r.workers) {
    w.Gauge("strata_worker_lent_slots", "Expert slots a worker lent to the KV pool",
            worker.lent_slots, {{"worker", absl::StrCat(worker.index)}});
  }
  return w.text();
}

}  // namespace strata
