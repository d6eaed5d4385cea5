#include "services/router/request_metrics.h"

#include "absl/strings/str_format.h"

namespace strata {
namespace {

const char* ReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

}  // namespace

RequestMetrics::RequestMetrics()
    : time_to_first_token_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token_latency_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void RequestMetrics::AddToken(bool first, double since) {
  tokens_.fetch_add(1, std::memory_order_relaxed);
  (first ? time_to_first_token_ : inter_token_latency_).Observe(since);
}

void RequestMetrics::Record(const RequestUsage& usage, double decode_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ++totals_.requests;
  totals_.prompt_tokens += usage.prompt_tokens;
  totals_.generated_tokens += usage.completion_tokens;
  if (usage.completion_tokens > 0) {
    totals_.ttft_ms_sum += usage.time_to_first_token_ms;
    ++totals_.ttft_count;
  }
  if (usage.completion_tokens > 1) {
    totals_.inter_token_ms_sum += decode_ms;
    totals_.inter_token_count += usage.completion_tokens - 1;
  }
}

RequestMetrics::Totals RequestMetrics::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  Totals totals = totals_;
  totals.tokens_so_far = tokens_.load(std::memory_order_relaxed);
  return totals;
}

std::string FinishedRequestLine(const std::string& id, FinishReason reason,
                                const RequestUsage& usage) {
  return absl::StrFormat(
      "request %s finished (%s): %d prompt tokens, %d generated, TTFT %.1f ms, %.1f tok/s decode",
      id, ReasonName(reason), usage.prompt_tokens, usage.completion_tokens,
      usage.time_to_first_token_ms, usage.decode_tokens_per_second);
}

bool Busy(const RequestMetrics::Totals& before, const RequestMetrics::Totals& now,
          const ThroughputState& state) {
  return now.requests != before.requests || now.tokens_so_far != before.tokens_so_far ||
         state.running > 0 || state.queued > 0;
}

std::string ThroughputLine(const RequestMetrics::Totals& before, const RequestMetrics::Totals& now,
                           double seconds, const ThroughputState& state) {
  const double span = seconds > 0 ? seconds : 1;
  std::string line = absl::StrFormat(
      "last %.0f s: %d requests finished, %.1f generated tok/s; %d running, %d queued, KV "
      "blocks %d/%d used",
      seconds, now.requests - before.requests, (now.tokens_so_far - before.tokens_so_far) / span,
      state.running, state.queued, state.used_kv_blocks, state.total_kv_blocks);
  const ExpertUses& u = state.expert_uses;
  const double uses = static_cast<double>(u.hot + u.warm + u.cold);
  if (uses > 0) {
    absl::StrAppendFormat(&line, "; expert uses %.1f%% hot, %.1f%% warm, %.1f%% cold",
                          100 * u.hot / uses, 100 * u.warm / uses, 100 * u.cold / uses);
  }
  return line;
}

}  // namespace strata
