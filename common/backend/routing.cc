#include "common/backend/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace strata {
namespace {

void Softmax(float* v, int count) {
  const float m = *std::max_element(v, v + count);
  float sum = 0.0f;
  for (int i = 0; i < count; ++i) sum += (v[i] = std::exp(v[i] - m));
  for (int i = 0; i < count; ++i) v[i] /= sum;
}

// The indices of the k largest values, best first; ties go to the lower index.
void TopK(const float* values, int count, int k, std::vector<int>& order) {
  order.resize(count);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int x, int y) {
    return values[x] > values[y] || (values[x] == values[y] && x < y);
  });
}

// DeepSeek-V3's "noaux_tc" choice: sigmoid scores; a group's merit is the sum of its two best
// biased scores; the top_k_groups best groups are eligible and the top_k experts among them are
// chosen by biased score, weighted by unbiased score.
void SelectSigmoidGrouped(const ModelConfig& c, float* logits, const float* correction_bias,
                          int32_t* experts, float* weights) {
  const int e_count = c.num_experts;
  const int groups = c.num_expert_groups;
  const int per_group = e_count / groups;
  thread_local std::vector<float> choice, group_score;
  thread_local std::vector<int> order;
  choice.resize(e_count);
  for (int e = 0; e < e_count; ++e) {
    logits[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = logits[e] + (correction_bias != nullptr ? correction_bias[e] : 0.0f);
  }
  if (c.top_k_groups < groups) {
    group_score.resize(groups);
    for (int g = 0; g < groups; ++g) {
      const float* v = choice.data() + g * per_group;
      TopK(v, per_group, std::min(2, per_group), order);
      group_score[g] = v[order[0]] + (per_group > 1 ? v[order[1]] : 0.0f);
    }
    TopK(group_score.data(), groups, c.top_k_groups, order);
    thread_local std::vector<bool> kept;
    kept.assign(groups, false);
    for (int i = 0; i < c.top_k_groups; ++i) kept[order[i]] = true;
    // Experts of dropped groups never win, as in DeepSeek's reference. transformers scores them
    // 0 instead, which differs only where a kept expert's biased score is negative.
    for (int e = 0; e < e_count; ++e) {
      if (!kept[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
    }
  }
  TopK(choice.data(), e_count, c.top_k, order);
  float sum = 0.0f;
  for (int i = 0; i < c.top_k; ++i) {
    experts[i] = order[i];
    weights[i] = logits[order[i]];
    sum += weights[i];
  }
  const float scale = static_cast<float>(c.routed_scaling_factor);
  for (int i = 0; i < c.top_k; ++i) {
    // transformers' order of operations, and its 1e-20 guard against a zero sum.
    if (c.norm_topk_prob) weights[i] /= sum + 1e-20f;
    weights[i] *= scale;
  }
}

}  // namespace

void SelectExperts(const ModelConfig& config, float* logits, float temperature,
                   const float* correction_bias, int32_t* experts, float* weights) {
  const int e_count = config.num_experts;
  const int k = config.top_k;
  for (int e = 0; e < e_count; ++e) logits[e] /= temperature;
  if (config.gate_scoring == GateScoring::kSigmoidGrouped) {
    SelectSigmoidGrouped(config, logits, correction_bias, experts, weights);
    return;
  }
  if (config.gate_scoring == GateScoring::kSoftmaxThenTopK) Softmax(logits, e_count);
  thread_local std::vector<int> order;
  TopK(logits, e_count, k, order);
  for (int i = 0; i < k; ++i) {
    experts[i] = order[i];
    weights[i] = logits[order[i]];
  }
  if (config.gate_scoring == GateScoring::kTopKThenSoftmax) {
    Softmax(weights, k);
  } else if (config.norm_topk_prob) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += weights[i];
    for (int i = 0; i < k; ++i) weights[i] /= sum;
  }
}

}  // namespace strata
