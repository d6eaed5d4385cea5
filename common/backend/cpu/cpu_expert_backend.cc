#include "common/backend/cpu/cpu_expert_backend.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_kernels.h"

namespace strata {

CpuExpertBackend::CpuExpertBackend(const ModelConfig& config, const ExpertWeightSource& experts,
                                   ThreadPool& pool)
    : config_(config), experts_(experts), pool_(pool) {}

absl::Status CpuExpertBackend::RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                                          Tensor& out) {
  if (layer < 0 || layer >= config_.num_layers || !config_.layer_is_moe[layer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("run experts: layer ", layer, " has no experts"));
  }
  const int64_t n = x.rows();
  const int64_t h = config_.hidden_size;
  if (x.cols() != h || routing.num_tokens() != n) {
    return absl::InvalidArgumentError("run experts: input does not match the routing table");
  }
  // Slots per expert, in token order.
  std::vector<std::vector<int64_t>> slots(config_.num_experts);
  for (int64_t s = 0; s < static_cast<int64_t>(routing.expert.size()); ++s) {
    const int32_t e = routing.expert[s];
    if (e < 0) continue;
    if (e >= config_.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("run experts: expert id ", e, " out of range"));
    }
    slots[e].push_back(s);
  }
  out.Resize(n, h);
  out.SetZero();
  for (int e = 0; e < config_.num_experts; ++e) {
    const std::vector<int64_t>& mine = slots[e];
    if (mine.empty()) continue;
    const FfnWeights* expert = experts_.Find(layer, e);
    if (expert == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("run experts: no weights for expert ", e, " of layer ", layer));
    }
    const int64_t m = static_cast<int64_t>(mine.size());
    gathered_.Resize(m, h);
    for (int64_t r = 0; r < m; ++r) {
      const float* src = x.row(mine[r] / routing.top_k);
      std::copy(src, src + h, gathered_.row(r));
    }
    scratch_.Resize(2 * m, expert->gate.out);
    expert_out_.Resize(m, h);
    cpu::Ffn(pool_, config_, *expert, gathered_.data(), m, scratch_.data(), expert_out_.data());
    for (int64_t r = 0; r < m; ++r) {
      const float w = routing.weight[mine[r]];
      float* dst = out.row(mine[r] / routing.top_k);
      const float* src = expert_out_.row(r);
      for (int64_t i = 0; i < h; ++i) dst[i] += w * src[i];
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
