#include "common/engine/forward_pass.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {

ForwardPass::ForwardPass(const ModelConfig& config, RouterBackend& router, ExpertBackend& experts,
                         ForwardOptions options)
    : config_(config), router_(router), experts_(experts), options_(options) {}

absl::Status ForwardPass::Check(absl::Span<const int32_t> ids, const BatchLayout& batch) const {
  if (static_cast<int64_t>(ids.size()) != batch.num_tokens() ||
      batch.sequence.size() != batch.position.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: ", ids.size(), " ids for a batch of ", batch.num_tokens()));
  }
  if (!(options_.gate_temperature > 0.0f)) {
    return absl::InvalidArgumentError("gate_temperature must be positive");
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Run(absl::Span<const int32_t> ids, const BatchLayout& batch,
                              PagedKvCache& kv, absl::Span<const int64_t> logit_rows,
                              Tensor& logits) {
  RETURN_IF_ERROR(Check(ids, batch));
  if (options_.on_batch) options_.on_batch(batch);
  RETURN_IF_ERROR(router_.BeginStep(ids, batch, kv));
  predicted_layer_ = -1;
  hinted_through_ = 0;
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    RETURN_IF_ERROR(router_.Attention(layer));
    RETURN_IF_ERROR(router_.PrepareFfn(layer, options_.gate_temperature, ffn_input_, routing_));
    RETURN_IF_ERROR(router_.DenseFfn(layer));
    if (config_.layer_is_moe[layer]) {
      if (predicted_layer_ == layer) ScorePrediction(routing_);
      if (options_.on_routing) options_.on_routing(layer, routing_);
      RETURN_IF_ERROR(experts_.RunExperts(layer, ffn_input_, routing_, expert_out_));
      RETURN_IF_ERROR(router_.Combine(expert_out_, experts_.output_ready_flag()));
    }
    if (options_.predict_next_experts) RETURN_IF_ERROR(PredictNext(layer));
  }
  RETURN_IF_ERROR(router_.Logits(logit_rows, logits));
  RETURN_IF_ERROR(experts_.FinishStep());
  // After the step's logits: a device backend's observations are complete in stream order.
  if (kv.calibrating()) RETURN_IF_ERROR(router_.ReportKvRange(kv));
  return absl::OkStatus();
}

absl::Status ForwardPass::PredictNext(int layer) {
  if (!experts_.wants_prefetch()) return absl::OkStatus();  // every expert resident
  const int next = layer + 1;
  const int reach = std::min(layer + options_.prefetch_lookahead, config_.num_layers - 1);
  // Layers further ahead first: the backend scores the prediction it made last (the next
  // layer's). Each is hinted once, from the earliest residual within reach.
  for (int target = std::max(hinted_through_ + 1, next + 1); target <= reach; ++target) {
    hinted_through_ = target;
    if (!config_.layer_is_moe[target]) continue;
    RETURN_IF_ERROR(router_.PredictRouting(target, options_.gate_temperature, ahead_));
    if (ahead_.tokens == 0) break;  // a captured step predicts nothing
    RETURN_IF_ERROR(SendPrediction(target, ahead_));
  }
  if (next >= config_.num_layers || !config_.layer_is_moe[next]) return absl::OkStatus();
  // The next layer's gate sees norm(hidden + its attention); without the attention yet, this
  // layer's output is the best guess, and the copies overlap that attention.
  RETURN_IF_ERROR(router_.PredictRouting(next, options_.gate_temperature, predicted_));
  if (predicted_.tokens == 0) return absl::OkStatus();
  // Device routing is scored by the backend (DevicePredictionCounts), and sent only with a
  // lookahead (reading it waits for the layer's work).
  if (predicted_.on_device() && options_.prefetch_lookahead == 0) return absl::OkStatus();
  // Host routing is scored here (ScorePrediction), device routing by the backend.
  if (!predicted_.on_device()) predicted_layer_ = next;
  return SendPrediction(next, predicted_);
}

absl::Status ForwardPass::SendPrediction(int layer, RoutingTable& predicted) {
  if (!predicted.on_device()) {
    experts_.Prefetch(layer, predicted);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(router_.ReadPredictedRouting(predicted_on_host_));
  experts_.Prefetch(layer, predicted_on_host_);
  return absl::OkStatus();
}

void ForwardPass::ScorePrediction(const RoutingTable& actual) {
  if (actual.on_device() || actual.top_k != predicted_.top_k ||
      actual.tokens != predicted_.tokens) {
    return;
  }
  const int k = actual.top_k;
  uint64_t predicted = 0, correct = 0, picked = 0;
  for (int64_t t = 0; t < actual.tokens; ++t) {
    const int32_t* want = &predicted_.expert[t * k];
    for (int j = 0; j < k; ++j) {
      const int32_t e = actual.expert[t * k + j];
      if (e >= 0) ++picked;
      if (want[j] >= 0) ++predicted;
      if (e >= 0 && std::find(want, want + k, e) != want + k) ++correct;
    }
  }
  prefetch_.predicted.fetch_add(predicted);
  prefetch_.correct.fetch_add(correct);
  prefetch_.actual.fetch_add(picked);
}

}  // namespace strata
