// The router side of the forward pass on a CUDA device: bf16 activations in device memory,
// the paged KV cache in device memory (block tables from the host PagedKvCache), the gate's
// routing left on the device for a CudaExpertBackend to read. Every residual add is fused with
// the RMSNorm that follows it (LaunchAddRmsNorm), so the normalized input of the next stage is
// ready when it is called. For steps of a few tokens the add + norm after the attention of a
// MoE layer is launched by PrepareFfn instead, in one kernel with the gate and its top-k.
#ifndef STRATA_COMMON_BACKEND_CUDA_CUDA_ROUTER_BACKEND_H_
#define STRATA_COMMON_BACKEND_CUDA_CUDA_ROUTER_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/cuda/cuda_weights.h"
#include "common/backend/cuda/device_router.h"
#include "common/backend/cuda/linear.h"
#include "common/backend/rope.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/kernels/moe_gate_kernels.h"
#include "common/cuda/kernels/norm_gate_kernels.h"
#include "common/cuda/kernels/paged_kv_kernels.h"
#include "common/cuda/kernels/sampling_kernels.h"
#include "common/cuda/virtual_device_memory.h"
#include "common/model/model_weights.h"

namespace strata::gpu {

struct CudaBackendOptions {
  int max_tokens = 512;     // the largest step, in tokens
  int max_sequences = 256;  // sequences in one step
  // The attention projections (q, k, v, o): bf16, or FP8 E4M3 quantized at load; the gate,
  // embedding and lm_head stay bf16.
  WeightFormat attention_format = WeightFormat::kBf16;
};

class CudaRouterBackend : public RouterBackend, public DeviceRouter {
 public:
  // `model`, `context` and the KV cache described by `kv` must outlive the backend; the cache's
  // keys and values live on the device, allocated here.
  static absl::StatusOr<std::unique_ptr<CudaRouterBackend>> Create(const Model& model,
                                                                   const KvPoolOptions& kv,
                                                                   CudaContext* context,
                                                                   CudaBackendOptions options);

  absl::Status BeginStep(absl::Span<const int32_t> ids, const BatchLayout& batch,
                         PagedKvCache& kv) override;
  absl::Status Attention(int layer) override;
  absl::Status PrepareFfn(int layer, float temperature, Tensor& ffn_input,
                          RoutingTable& routing) override;
  absl::Status DenseFfn(int layer) override;
  absl::Status Combine(const Tensor& partial, const uint32_t* ready_flag) override;
  // Eager steps only (prefill, steps without graphs): the next layer's norm and gate on the
  // residual into device routing, scored on the device once that layer's gate has run. A
  // captured decode step predicts nothing (tokens 0): three launches a layer would cost every
  // replay what the prediction saves only where copies happen.
  absl::Status PredictRouting(int layer, float temperature, RoutingTable& predicted) override;
  absl::Status ReadPredictedRouting(RoutingTable& host) override;
  PredictionCounts DevicePredictionCounts() const override;
  absl::StatusOr<int64_t> ResizeKv(PagedKvCache& kv, int blocks) override;
  absl::Status Logits(absl::Span<const int64_t> rows, Tensor& logits) override;
  absl::Status ReportKvRange(PagedKvCache& kv) override;
  DeviceRouter* device_router() override { return this; }

  // DeviceRouter.
  CudaContext* context() const override { return context_; }
  absl::Status PrepareGraphs(int max_context, int max_sequences) override;
  absl::Status EnterGraphMode(int sequences, int slot) override;
  void LeaveGraphMode() override { graph_mode_ = false; }
  absl::Status WriteDecodeInputs(int slot, absl::Span<const int32_t> tokens,
                                 absl::Span<const int32_t> positions,
                                 absl::Span<const PagedKvCache::SequenceId> sequences,
                                 PagedKvCache& kv, absl::Span<const RowSampling> sampling) override;
  const int32_t* decode_greedy(int slot) const override { return host_[slot].greedy.data(); }
  absl::StatusOr<const float*> CopyDecodeLogits(absl::Span<const int64_t> rows) override;
  void SetGateHandOffSource(GateHandOffSource* source) override { hand_off_source_ = source; }

 private:
  struct LayerWeights {
    DeviceWeight q, k, v, o;
    const bf16* input_norm = nullptr;
    const bf16* post_norm = nullptr;
    const bf16* q_norm = nullptr;
    const bf16* k_norm = nullptr;
    const float* sinks = nullptr;
    DeviceWeight router;   // MoE layers
    bool has_ffn = false;  // a dense MLP (dense layers) or a shared expert (MoE layers)
    ExpertWeightTable ffn;
    const bf16* shared_gate = nullptr;       // [hidden]: the shared expert's sigmoid gate
    const float* correction_bias = nullptr;  // [num_experts]: sigmoid-grouped gates' bias
    // Multi-head latent attention (k and v absent; q is q_b_proj when q_a is present).
    DeviceWeight q_a, kv_a, kv_b;
    const bf16* q_a_norm = nullptr;
    const bf16* kv_a_norm = nullptr;
  };

  CudaRouterBackend(const Model& model, CudaContext* context, CudaBackendOptions options)
      : config_(model.config),
        context_(context),
        options_(options),
        store_(context->stream()),
        linear_(context) {}
  absl::Status Load(const Model& model, const KvPoolOptions& kv);
  // The norm weight applied after layer `layer`'s residual stream is complete.
  const bf16* NextNorm(int layer) const;
  // The gate's parameters for this model at `temperature`.
  MoeGateParams GateParams(int layer, float temperature) const;
  // Layer `layer`'s post-attention add + norm, gate and top-k for a step of n tokens as one
  // launch's arguments (LaunchAddNormGate; no hand-off).
  AddNormGateArgs NormGateArgs(int layer, int64_t n);
  // Whether they run as that one launch: Attention then leaves the add + norm to PrepareFfn.
  bool FusesNormAndGate(int layer, int64_t n);
  // Multi-head latent attention's weights (cuda_latent_attention.cc).
  absl::Status LoadLatentWeights(const AttentionWeights& a, WeightFormat format, LayerWeights& dst);
  // Attention of a latent-attention layer, into attn_ [n, heads * v_head_dim].
  absl::Status LatentAttention(int layer);
  // Layer `layer`'s part of the paged KV cache, with this step's block tables.
  PagedKvLayer KvLayer(int layer) const;
  // o_proj of attn_ into proj_, then the post-attention add + norm (or its hand-over to
  // PrepareFfn).
  absl::Status FinishAttention(int layer);
  // The post-attention add + norm Attention left to PrepareFfn, as its own launch.
  absl::Status ApplyPostNorm(int layer);
  // hidden += x, then normed_ = RmsNorm(hidden) with the weight of the next consumer.
  // ready_flag: x is behind it (LaunchAddRmsNorm).
  absl::Status AddAndNormalize(const bf16* x, int layer, int64_t n,
                               const uint32_t* ready_flag = nullptr);
  absl::Status UploadBatch(const BatchLayout& batch, PagedKvCache& kv);
  absl::Status Embed(absl::Span<const int32_t> ids);

  // What the host writes for a step, pinned, which the step's copies read (Stage); and, for
  // a replay, its rows' sampling settings and where its tokens land.
  struct HostInputs {
    PinnedBuffer<int32_t> ids, positions, token_seq, tables, rows, greedy;
    PinnedBuffer<SampleParams> sampling;
    PinnedBuffer<LogitEntry> entries;  // the rows' transform lists, read by the device in place
  };
  // The rows' sampling into `host` (every prepared row: those past `sampling` greedy).
  absl::Status WriteSampling(HostInputs& host, absl::Span<const RowSampling> sampling);
  static absl::Status AllocateHostInputs(HostInputs& inputs, size_t tokens, size_t table_entries,
                                         size_t greedy);
  // Eager steps use slot 0; a graph the slot it is captured for.
  HostInputs& host_inputs() { return host_[graph_mode_ ? graph_slot_ : 0]; }
  absl::Status RunSingleExpert(const ExpertWeightTable& table, const bf16* x, int64_t n, bf16* out);

  // Copies host[0, count) to `device` through its pinned mirror (capturable).
  template <typename T>
  absl::Status Stage(const T* host, size_t count, PinnedBuffer<T>& pinned, DeviceBuffer<T>& device);

  const ModelConfig& config_;
  CudaContext* context_;
  CudaBackendOptions options_;
  DeviceWeightStore store_;
  LinearRunner linear_;

  const bf16* embedding_ = nullptr;
  DeviceWeight lm_head_;
  const bf16* final_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  const float* inv_freq_ = nullptr;
  float attention_scaling_ = 1.0f;

  // The paged KV cache, block-major: [block][layer][k|v][slot][kv_head][head_dim] bf16, or
  // E4M3 codes (kv_fp8_: blocks half the bytes; wide rows as PagedKvLayer says).
  VirtualDeviceMemory kv_memory_;
  int64_t kv_block_bytes_ = 0;  // one layer's block
  size_t KvBytes(int64_t blocks) const {
    return static_cast<size_t>(kv_block_bytes_ * config_.num_layers * blocks);
  }
  int block_size_ = 0;
  bool kv_fp8_ = false;
  DeviceBuffer<float> kv_scales_;  // [layer][k|v][kv_head]
  DeviceBuffer<float> kv_amax_;    // calibration: [layer][k|v][kv_head], reset by ReportKvRange
  bool kv_scales_uploaded_ = false;
  bool observe_kv_ = false;      // this step notes its keys' and values' magnitudes
  int64_t observed_tokens_ = 0;  // since the last ReportKvRange
  DeviceBuffer<KvMoveBlock> kv_moves_;
  std::vector<KvMoveBlock> moves_host_;
  // Before a step: the cache's scales to the device once they are set, and its pending block
  // moves (conversions to 16-bit, compaction), on the stream before the step's kernels (eager
  // steps and replays, never while capturing).
  absl::Status SyncKv(PagedKvCache& kv);
  absl::Status ApplyKvMoves(PagedKvCache& kv);
  // A row of the block tables as the kernels read it (wide rows marked).
  void WriteTableRow(const PagedKvCache& kv, PagedKvCache::SequenceId seq, int32_t* row,
                     int width) const;

  // Activations, sized for options_.max_tokens.
  DeviceBuffer<bf16> hidden_, normed_, q_, k_, v_, attn_, proj_, ffn_out_, gathered_;
  // Latent attention's: q_a's output, the queries in cache space [n, heads, rank + rope] and
  // the heads' latent outputs [n, heads, rank].
  DeviceBuffer<bf16> latent_q_, latent_queries_, latent_out_;
  DeviceBuffer<float> gate_logits_, logits_;
  // PredictRouting's: the next layer's normed residual, its predicted routing, and the running
  // counts (predicted, correct, actual), copied to the host after every step.
  DeviceBuffer<bf16> predict_normed_;
  DeviceBuffer<int32_t> predicted_ids_;
  DeviceBuffer<float> predicted_weights_;
  DeviceBuffer<unsigned long long> prediction_counts_;
  PinnedBuffer<unsigned long long> prediction_counts_host_;
  int predicted_layer_ = -1;  // the layer predicted_ids_ guesses, until its gate runs
  DeviceBuffer<int32_t> ids_, positions_, token_seq_, block_tables_, routing_ids_, rows_;
  DeviceBuffer<float> routing_weights_;
  DeviceBuffer<uint32_t> gate_blocks_done_;  // LaunchAddNormGate's block counter
  DeviceBuffer<int32_t> single_ids_;         // zeros: every token to expert 0
  DeviceBuffer<float> single_weights_;       // ones
  DeviceBuffer<uint8_t> ffn_workspace_, attention_workspace_;
  DeviceBuffer<uint8_t> cluster_workspace_;  // cluster decode plans', zeroed once
  HostInputs host_[kInputSlots];
  // Graph mode: the decode step's tokens (argmax on the device, then drawn for the rows that
  // sample) and, on demand, its rows.
  DeviceBuffer<int32_t> greedy_;
  DeviceBuffer<SampleParams> sampling_;
  DeviceBuffer<int32_t> token_history_;  // [sequences][kTokenHistory] (LaunchRecordTokens)
  DeviceBuffer<uint8_t> argmax_scratch_;
  DeviceBuffer<uint8_t> sample_scratch_;  // LaunchSample's
  PinnedBuffer<float> pinned_logits_;
  bool graph_mode_ = false;
  int graph_slot_ = 0;
  int graph_max_blocks_ = 0;
  int graph_max_context_ = 0;
  int graph_sequences_ = 1;
  int graph_prepared_sequences_ = 0;
  DeviceBuffer<uint8_t> graph_attention_workspace_;  // graph mode's, sized by PrepareGraphs
  int num_blocks_ = 0;
  int max_blocks_per_seq_ = 0;
  int max_context_ = 0;
  int64_t step_tokens_ = 0;
  bool one_token_per_sequence_ = false;  // this step's, from UploadBatch
  int max_queries_per_seq_ = 1;          // this step's, from UploadBatch
  int current_layer_ = 0;
  // The layer whose post-attention add + norm PrepareFfn owes (FusesNormAndGate); -1: none.
  int pending_post_norm_ = -1;
  GateHandOffSource* hand_off_source_ = nullptr;  // SetGateHandOffSource's; may be null
  std::shared_ptr<void> keep_alive_;  // device views share the backend's lifetime marker
  std::vector<int32_t> host_ints_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_CUDA_ROUTER_BACKEND_H_
