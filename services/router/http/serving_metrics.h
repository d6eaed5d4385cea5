// What /metrics reports: the HTTP API's requests by outcome, every request's tokens and latency
// (RequestMetrics: gRPC and HTTP alike), and a snapshot of the router's state (scheduler, KV
// pool, workers' tiers, prefetch) taken per scrape.
#ifndef STRATA_SERVICES_ROUTER_HTTP_SERVING_METRICS_H_
#define STRATA_SERVICES_ROUTER_HTTP_SERVING_METRICS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/engine/replay_or_eager.h"
#include "services/router/http/metrics.h"
#include "services/router/request_metrics.h"

namespace strata {

// How an HTTP API request ended.
enum class RequestOutcome { kSuccess, kInvalid, kRejected, kCancelled, kError, kCount };
const char* OutcomeName(RequestOutcome outcome);

struct ServingMetrics {
  void Count(RequestOutcome outcome) {
    requests[static_cast<int>(outcome)].fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> requests[static_cast<int>(RequestOutcome::kCount)] = {};
};

struct RouterSnapshot {
  int waiting = 0;
  int running = 0;
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int kv_blocks_borrowed = 0;  // of kv_blocks_total, in memory the workers lent
  int64_t steps = 0;
  int64_t graph_steps = 0;  // of steps, replayed as CUDA graphs
  ReplayOrEager::Counts replay_or_eager;
  int64_t preemptions = 0;
  int64_t prompt_tokens_computed = 0;  // prompt positions steps computed (prefill)
  int64_t prefix_queried_tokens = 0;   // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;       // of those, found cached
  int64_t prefix_cached_blocks = 0;
  int64_t draft_tokens = 0;           // speculation: drafted
  int64_t accepted_draft_tokens = 0;  // and accepted
  int64_t worker_restarts = 0;
  int64_t reroutes = 0;
  uint64_t expert_wire_bytes_sent = 0;  // gRPC-transport workers' messages
  uint64_t expert_wire_bytes_received = 0;
  uint64_t prefetch_predicted = 0;
  uint64_t prefetch_correct = 0;
  uint64_t prefetch_actual = 0;
  struct Worker {
    int index = 0;
    bool connected = false;
    uint64_t hot_hits = 0;
    uint64_t warm_hits = 0;
    uint64_t misses = 0;  // cold: copied in or computed by strata-expert-store
    uint64_t prefetch_loads = 0;
    uint64_t prefetch_hits = 0;
    uint32_t lent_slots = 0;  // expert slots lent to the KV pool
  };
  std::vector<Worker> workers;
};

// The whole /metrics page.
std::string RenderMetrics(const ServingMetrics& serving, const RequestMetrics& requests,
                          const RouterSnapshot& router);

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_HTTP_SERVING_METRICS_H_
