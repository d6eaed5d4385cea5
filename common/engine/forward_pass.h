// One forward step of the model over a batch of tokens, driving a router backend and an
// expert backend layer by layer.
#ifndef STRATA_COMMON_ENGINE_FORWARD_PASS_H_
#define STRATA_COMMON_ENGINE_FORWARD_PASS_H_

#include <atomic>
#include <functional>

#include "common/backend/backend.h"
#include "common/model/model_config.h"

namespace strata {

struct ForwardOptions {
  float gate_temperature = 1.0f;  // gate logits are divided by this before scoring
  // Sees every MoE layer's routing (expert activation statistics); may be empty.
  std::function<void(int layer, const RoutingTable& routing)> on_routing;
  // Sees every batch before it runs (the router sets the hot ratio by context length).
  std::function<void(const BatchLayout& batch)> on_batch;
  // After each layer, apply the next MoE layer's norm and gate to this layer's output to
  // predict its experts, and hand them to ExpertBackend::Prefetch before the next attention
  // (only while the expert backend wants_prefetch()).
  bool predict_next_experts = false;
  // With predict_next_experts: also hint the experts of MoE layers up to this many layers ahead,
  // each once, at the earliest layer within reach (its gate on the residual as it is then), so
  // that their copies overlap more than one attention; and hand device predictions (GPU
  // router, eager steps) to the workers, which costs a wait for the layer's work. 0: host
  // predictions of the next layer only (device ones are scored, not sent).
  int prefetch_lookahead = 0;
};

// How well the next layer's experts were predicted: per (token, slot), over layers that had a
// prediction.
struct PrefetchCounters {
  std::atomic<uint64_t> predicted{0};  // predicted picks
  std::atomic<uint64_t> correct{0};    // predicted picks the gate then made
  std::atomic<uint64_t> actual{0};     // the gate's picks
};

class ForwardPass {
 public:
  // The backends must outlive the pass.
  ForwardPass(const ModelConfig& config, RouterBackend& router, ExpertBackend& experts,
              ForwardOptions options);

  // Runs `ids` (laid out by `batch`, KV positions reserved) through every layer once and
  // writes the logits of rows `logit_rows` into `logits` [logit_rows.size(), vocab]. ABORTED:
  // the expert backend lost the step's work (ExpertBackend::FinishStep) and it must run again
  // (StepRunner does), rewriting its keys and values.
  absl::Status Run(absl::Span<const int32_t> ids, const BatchLayout& batch, PagedKvCache& kv,
                   absl::Span<const int64_t> logit_rows, Tensor& logits);
  // What Run tells its observers of a batch (the on_batch hook), for a step replayed from a
  // graph, which runs no host code of the pass.
  void NoteBatch(const BatchLayout& batch) {
    if (options_.on_batch) options_.on_batch(batch);
  }

  // The predictions scored so far, here (host routing) and by the router backend (device
  // routing). Thread-safe to read while Run is going.
  RouterBackend::PredictionCounts prefetch() const {
    RouterBackend::PredictionCounts c = router_.DevicePredictionCounts();
    c.predicted += prefetch_.predicted.load();
    c.correct += prefetch_.correct.load();
    c.actual += prefetch_.actual.load();
    return c;
  }

 private:
  const ModelConfig& config_;
  RouterBackend& router_;
  ExpertBackend& experts_;
  ForwardOptions options_;
  absl::Status Check(absl::Span<const int32_t> ids, const BatchLayout& batch) const;
  // Predicts layer + 1's experts from the residual stream and sends the hint; with a
  // lookahead, first the layers further ahead not hinted yet.
  absl::Status PredictNext(int layer);
  // Hands `predicted` (of `layer`; device routing read first) to the experts' prefetch.
  absl::Status SendPrediction(int layer, RoutingTable& predicted);
  void ScorePrediction(const RoutingTable& actual);

  Tensor ffn_input_, expert_out_;
  RoutingTable routing_, predicted_, ahead_, predicted_on_host_;
  int predicted_layer_ = -1;
  int hinted_through_ = 0;  // the last layer a lookahead hint went out for, this step
  PrefetchCounters prefetch_;
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_FORWARD_PASS_H_
