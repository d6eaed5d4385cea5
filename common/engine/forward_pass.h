// One forward step of the model over a batch of tokens, driving a router backend and an
// expert backend layer by layer.
#ifndef STRATA_COMMON_ENGINE_FORWARD_PASS_H_
#define STRATA_COMMON_ENGINE_FORWARD_PASS_H_

#include <functional>

#include "common/backend/backend.h"
#include "common/model/model_config.h"

namespace strata {

struct ForwardOptions {
  float router_temperature = 1.0f;  // gate logits are divided by this before scoring
  // Sees every MoE layer's routing (expert activation statistics); may be empty.
  std::function<void(int layer, const RoutingTable& routing)> on_routing;
};

class ForwardPass {
 public:
  // The backends must outlive the pass.
  ForwardPass(const ModelConfig& config, RouterBackend& router, ExpertBackend& experts,
              ForwardOptions options);

  // Runs `ids` (laid out by `batch`, KV positions reserved) through every layer and writes
  // the logits of hidden rows `logit_rows` into `logits` [logit_rows.size(), vocab].
  absl::Status Run(absl::Span<const int32_t> ids, const BatchLayout& batch, PagedKvCache& kv,
                   absl::Span<const int64_t> logit_rows, Tensor& logits);


 private:
  const ModelConfig& config_;
  RouterBackend& router_;
  ExpertBackend& experts_;
  ForwardOptions options_;
  Tensor hidden_, ffn_input_, expert_out_;
  RoutingTable routing_;
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_FORWARD_PASS_H_
