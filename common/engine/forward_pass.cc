#include "common/engine/forward_pass.h"

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {

ForwardPass::ForwardPass(const ModelConfig& config, RouterBackend& router, ExpertBackend& experts,
                         ForwardOptions options)
    : config_(config), router_(router), experts_(experts), options_(options) {}

absl::Status ForwardPass::Run(absl::Span<const int32_t> ids, const BatchLayout& batch,
                              PagedKvCache& kv, absl::Span<const int64_t> logit_rows,
                              Tensor& logits) {
  if (static_cast<int64_t>(ids.size()) != batch.num_tokens() ||
      batch.sequence.size() != batch.position.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: ", ids.size(), " ids for a batch of ", batch.num_tokens()));
  }
  if (!(options_.router_temperature > 0.0f)) {
    return absl::InvalidArgumentError("router_temperature must be positive");
  }
  RETURN_IF_ERROR(router_.Embed(ids, hidden_));
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    RETURN_IF_ERROR(router_.Attention(layer, batch, kv, hidden_));
    RETURN_IF_ERROR(
        router_.PrepareFfn(layer, hidden_, options_.router_temperature, ffn_input_, routing_));
    RETURN_IF_ERROR(router_.DenseFfn(layer, ffn_input_, hidden_));
    if (config_.layer_is_moe[layer]) {
      if (options_.on_routing) options_.on_routing(layer, routing_);
      RETURN_IF_ERROR(experts_.RunExperts(layer, ffn_input_, routing_, expert_out_));
      RETURN_IF_ERROR(router_.Combine(expert_out_, hidden_));
    }
  }
  return router_.Logits(hidden_, logit_rows, logits);
}

}  // namespace strata
