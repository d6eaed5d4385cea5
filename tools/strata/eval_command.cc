#include "tools/strata/eval_command.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <future>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "strata/v1/generation.grpc.pb.h"

namespace strata {
namespace {

std::vector<absl::Span<const int32_t>> Windows(const std::vector<int32_t>& ids, int size) {
  std::vector<absl::Span<const int32_t>> out;
  for (size_t start = 0; start < ids.size(); start += size) {
    const size_t len = std::min<size_t>(size, ids.size() - start);
    if (len >= 2) out.emplace_back(ids.data() + start, len);
  }
  return out;
}

absl::StatusOr<double> ScoreRemotely(const std::string& server,
                                     const std::vector<absl::Span<const int32_t>>& windows) {
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  // Several windows in flight keep the cluster's batch full.
  constexpr size_t kInFlight = 8;
  double nll = 0.0;
  for (size_t begin = 0; begin < windows.size(); begin += kInFlight) {
    std::vector<std::future<absl::StatusOr<double>>> pending;
    for (size_t w = begin; w < std::min(windows.size(), begin + kInFlight); ++w) {
      pending.push_back(std::async(std::launch::async, [&, w]() -> absl::StatusOr<double> {
        v1::ScoreRequest request;
        for (int32_t id : windows[w]) request.add_token_ids(static_cast<uint32_t>(id));
        v1::ScoreResponse response;
        grpc::ClientContext context;
        const grpc::Status s = stub->Score(&context, request, &response);
        if (!s.ok()) {
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                              absl::StrCat(server, ": ", s.error_message()));
        }
        if (response.logprobs_size() + 1 != static_cast<int>(windows[w].size())) {
          return absl::DataLossError("the server scored a different number of tokens");
        }
        double sum = 0.0;
        for (float lp : response.logprobs()) sum -= lp;
        return sum;
      }));
    }
    for (auto& p : pending) {
      ASSIGN_OR_RETURN(double window_nll, p.get());
      nll += window_nll;
    }
  }
  return nll;
}

}  // namespace

double WindowNll(const Tensor& logits, absl::Span<const int32_t> ids) {
  double nll = 0.0;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const float* row = logits.row(static_cast<int64_t>(i));
    const float max = *std::max_element(row, row + logits.cols());
    double sum = 0.0;
    for (int64_t v = 0; v < logits.cols(); ++v) sum += std::exp(static_cast<double>(row[v] - max));
    nll -= row[ids[i + 1]] - max - std::log(sum);
  }
  return nll;
}

absl::StatusOr<EvalResult> Evaluate(const EvalOptions& options) {
  if (options.window < 2) return absl::InvalidArgumentError("--window must be at least 2");
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   Tokenizer::FromModelDir(options.engine.model_dir));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(options.text_file));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text, false));
  const auto windows = Windows(ids, options.window);
  if (windows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(options.text_file, ": fewer than 2 tokens"));
  }
  EvalResult result;
  for (const auto& w : windows) result.tokens += static_cast<int64_t>(w.size()) - 1;
  double nll = 0.0;
  if (!options.server.empty()) {
    if (options.expert_stats || !options.hit_rate_shares.empty()) {
      return absl::InvalidArgumentError(
          "expert statistics and hit rates are measured in process only");
    }
    ASSIGN_OR_RETURN(nll, ScoreRemotely(options.server, windows));
  } else {
    LocalEngineOptions engine_options = options.engine;
    std::vector<std::vector<int64_t>>& counts = result.expert_counts;
    const bool trace_routing = !options.hit_rate_shares.empty();
    // One window's routing by layer ([layer] -> token-major top-k ids), replayed in token order
    // into `trace` once the window is done.
    std::vector<std::vector<int32_t>> window_routing;
    int top_k = 0;
    std::vector<ExpertKey> trace;
    if (options.expert_stats || trace_routing) {
      engine_options.on_routing = [&](int layer, const RoutingTable& routing) {
        if (options.expert_stats) {
          for (int32_t e : routing.expert) {
            if (e >= 0) ++counts[layer][e];
          }
        }
        if (trace_routing) {
          // A window longer than a prefill chunk comes in several steps, in order.
          window_routing[layer].insert(window_routing[layer].end(), routing.expert.begin(),
                                       routing.expert.end());
          top_k = routing.top_k;
        }
      };
    }
    ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(engine_options));
    if (options.expert_stats) {
      counts.assign(engine->config().num_layers,
                    std::vector<int64_t>(engine->config().num_experts, 0));
    }
    const ModelConfig& config = engine->config();
    // FP8 keys and values: the scales from unscored passes over the leading windows, as many
    // as calibration takes, so that every scored window is coded.
    for (size_t w = 0; w < windows.size() && engine->kv().calibrating(); ++w) {
      ASSIGN_OR_RETURN(Tensor unused, engine->Logits(windows[w]));
      result.kv_calibration_tokens = engine->kv().observed_tokens();
    }
    window_routing.assign(config.num_layers, {});
    for (const auto& w : windows) {
      for (auto& r : window_routing) r.clear();
      ASSIGN_OR_RETURN(Tensor logits, engine->Logits(w));
      nll += WindowNll(logits, w);
      if (!trace_routing || top_k == 0) continue;
      for (size_t t = 0; t < w.size(); ++t) {
        for (int layer = 0; layer < config.num_layers; ++layer) {
          const std::vector<int32_t>& r = window_routing[layer];
          for (int j = 0; j < top_k && (t + 1) * top_k <= r.size(); ++j) {
            if (r[t * top_k + j] >= 0) trace.push_back({layer, r[t * top_k + j]});
          }
        }
      }
    }
    if (trace_routing) {
      int moe_layers = 0;
      for (bool moe : config.layer_is_moe) moe_layers += moe;
      result.hit_rates =
          SimulateExpertCaches(trace, moe_layers * config.num_experts, options.hit_rate_shares);
    }
    // Dense layers route nothing: keep MoE layers only.
    counts.erase(std::remove_if(counts.begin(), counts.end(),
                                [](const auto& c) {
                                  return std::all_of(c.begin(), c.end(),
                                                     [](int64_t v) { return v == 0; });
                                }),
                 counts.end());
  }
  result.perplexity = std::exp(nll / static_cast<double>(result.tokens));
  return result;
}

std::vector<CacheHitRate> SimulateExpertCaches(absl::Span<const ExpertKey> trace, int pairs,
                                               absl::Span<const double> shares) {
  absl::flat_hash_map<ExpertKey, int64_t> uses;
  for (const ExpertKey& k : trace) ++uses[k];
  std::vector<int64_t> ranked;
  for (const auto& [key, n] : uses) ranked.push_back(n);
  std::sort(ranked.rbegin(), ranked.rend());
  std::vector<CacheHitRate> out;
  for (const double share : shares) {
    CacheHitRate r;
    r.share = share;
    r.slots = static_cast<int>(std::lround(share * pairs));
    LfuAgingPolicy lfu(r.slots, 8LL * std::max(r.slots, 1));
    const CacheSimResult sim = SimulateHitRate(lfu, trace);
    r.lfu = sim.hit_rate();
    int64_t covered = 0;
    for (int i = 0; i < r.slots && i < static_cast<int>(ranked.size()); ++i) covered += ranked[i];
    r.best_static = trace.empty() ? 0.0 : static_cast<double>(covered) / trace.size();
    out.push_back(r);
  }
  return out;
}

absl::Status RunEvalCommand(const EvalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(EvalResult result, Evaluate(options));
  nlohmann::json json;
  json["perplexity"] = result.perplexity;
  json["tokens"] = result.tokens;
  json["kv_cache_dtype"] = KvDtypeName(options.engine.kv.dtype);
  if (result.kv_calibration_tokens > 0) {
    json["kv_calibration_tokens"] = result.kv_calibration_tokens;
  }
  if (!result.expert_counts.empty()) {
    const GiniReport gini = GiniByLayer(result.expert_counts);
    json["expert_gini"] = gini.per_layer;
    json["gini_overall"] = gini.overall;
    json["expert_counts"] = result.expert_counts;
  }
  for (const CacheHitRate& r : result.hit_rates) {
    json["hit_rates"].push_back(
        {{"share", r.share}, {"slots", r.slots}, {"lfu", r.lfu}, {"best_static", r.best_static}});
  }
  out << json.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace strata
