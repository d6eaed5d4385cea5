// The reference implementation of the router side of a forward pass, in float32 on the CPU.
#ifndef STRATA_COMMON_BACKEND_CPU_CPU_ROUTER_BACKEND_H_
#define STRATA_COMMON_BACKEND_CPU_CPU_ROUTER_BACKEND_H_

#include <vector>

#include "common/backend/backend.h"
#include "common/backend/rope.h"
#include "common/model/model_weights.h"
#include "common/util/thread_pool.h"

namespace strata {

class CpuRouterBackend : public RouterBackend {
 public:
  // `model` and `pool` must outlive the backend.
  CpuRouterBackend(const Model& model, ThreadPool& pool);

  absl::Status BeginStep(absl::Span<const int32_t> ids, const BatchLayout& batch,
                         PagedKvCache& kv) override;
  absl::Status Attention(int layer) override;
  absl::Status PrepareFfn(int layer, float temperature, Tensor& ffn_input,
                          RoutingTable& routing) override;
  absl::Status DenseFfn(int layer) override;
  absl::Status Combine(const Tensor& partial, const uint32_t* ready_flag) override;
  absl::Status PredictRouting(int layer, float temperature, RoutingTable& predicted) override;
  absl::Status Logits(absl::Span<const int64_t> rows, Tensor& logits) override;
  absl::Status ReportKvRange(PagedKvCache& kv) override;

 private:
  // The step's new keys and values into the cache (FP8 codes, bf16 or float32).
  void WriteKv(int layer, PagedKvCache& kv);
  // Attention of token t's query head over its sequence's keys, into out[head_dim].
  void AttendHead(int layer, PagedKvCache& kv, int64_t t, int head, std::vector<float>& scores,
                  float* out) const;
  // Multi-head latent attention (cpu_latent_attention.cc): the layer's attention in the
  // absorbed form over the latent cache rows.
  absl::Status LatentAttention(int layer);
  // Softmax attention of one absorbed query row [rank + rope] of token t over its
  // sequence's cached rows, the weighted latents into out[kv_lora_rank].
  void AttendLatentHead(int layer, int64_t t, const float* query, std::vector<float>& scores,
                        float* out) const;
  // out = post_attention_norm(hidden_) of `layer`, and its routing on MoE layers.
  absl::Status NormAndRoute(int layer, float temperature, Tensor& out, RoutingTable& routing);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  ThreadPool& pool_;
  RopeTable rope_;
  // Each layer's router correction bias as float32; empty where it has none.
  std::vector<std::vector<float>> correction_bias_;
  // The step: its layout, its KV cache, the residual stream and the FFN input.
  BatchLayout batch_;
  // Calibration of an FP8 cache: the largest |key| and |value| per (layer, kv head) written
  // since the last report, and the steps' tokens.
  std::vector<float> k_amax_, v_amax_;
  int64_t observed_tokens_ = 0;
  PagedKvCache* kv_ = nullptr;
  Tensor hidden_, ffn_input_;
  // Scratch buffers reused across calls.
  Tensor normed_, predict_input_, q_, k_, v_, attn_out_, proj_out_, gate_logits_, ffn_scratch_,
      ffn_out_;
  Tensor mla_q_latent_, mla_queries_, mla_gather_, mla_head_out_, mla_latent_out_;
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_CPU_CPU_ROUTER_BACKEND_H_
