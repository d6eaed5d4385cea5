// The compute seam. A forward pass is split the way the cluster splits it:
//  - RouterBackend: everything but the routed experts (embedding, attention over the paged KV
//    cache, the gate and its top-k, dense and shared-expert FFNs, final norm, lm_head); it
//    runs in the router process.
//  - ExpertBackend: runs a set of experts for a set of tokens and sums their weighted outputs
//    per token; it runs in an expert worker.
// The CPU implementations are always built; a CUDA implementation is built when nvcc exists.
#ifndef STRATA_COMMON_BACKEND_BACKEND_H_
#define STRATA_COMMON_BACKEND_BACKEND_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/kv/paged_kv_cache.h"
#include "common/tensor/tensor.h"

namespace strata {

// Where each token of a step sits: its KV-cache sequence and its position in it. Tokens of
// one sequence appear in position order; a step may mix prefill chunks and decode tokens.
struct BatchLayout {
  std::vector<PagedKvCache::SequenceId> sequence;
  std::vector<int64_t> position;

  int64_t num_tokens() const { return static_cast<int64_t>(position.size()); }
};

// The gate's choice for each token: top_k (expert, weight) slots per token, row-major
// [num_tokens][top_k]. An expert id of -1 marks a slot some other backend handles. A host
// backend fills `expert` and `weight`; a device backend leaves them empty and points
// `device_expert` / `device_weight` at its own device arrays (valid until its next call).
struct RoutingTable {
  int top_k = 0;
  int64_t tokens = 0;
  std::vector<int32_t> expert;
  std::vector<float> weight;
  const int32_t* device_expert = nullptr;
  const float* device_weight = nullptr;

  int64_t num_tokens() const { return tokens; }
  bool on_device() const { return device_expert != nullptr; }
  void Resize(int64_t num_tokens, int k) {
    top_k = k;
    tokens = num_tokens;
    expert.assign(num_tokens * k, -1);
    weight.assign(num_tokens * k, 0.0f);
    device_expert = nullptr;
    device_weight = nullptr;
  }
};

namespace gpu {
class DeviceRouter;
class DeviceExperts;
}  // namespace gpu
class GraphStepExperts;

// The router's side of a step. A step's activations (the residual stream, the FFN input) live
// in the backend from BeginStep until the next BeginStep: the methods below work on them in
// layer order.
class RouterBackend {
 public:
  virtual ~RouterBackend() = default;

  // Starts a step: the residual stream becomes the embeddings of `ids`, laid out by `batch`
  // (one id per token; the tokens' KV positions reserved in `kv`, which must outlive the step).
  virtual absl::Status BeginStep(absl::Span<const int32_t> ids, const BatchLayout& batch,
                                 PagedKvCache& kv) = 0;

  // residual += o_proj(attention(input_norm(residual))), writing the tokens' keys and values
  // into the step's KV cache first. A device backend may leave the residual add to the
  // PrepareFfn call that follows (fused with its norm and gate).
  virtual absl::Status Attention(int layer) = 0;

  // ffn_input = post_attention_norm(residual), a view valid until the next call. On MoE layers
  // also fills `routing` with the top-k experts and weights, the gate logits divided by
  // `temperature` first.
  virtual absl::Status PrepareFfn(int layer, float temperature, Tensor& ffn_input,
                                  RoutingTable& routing) = 0;

  // residual += the layer's dense MLP (dense layers) or gated shared expert (MoE layers that
  // have one) of the FFN input; a no-op for MoE layers without a shared expert.
  virtual absl::Status DenseFfn(int layer) = 0;

  // residual += partial: the combine of the experts' weighted outputs into the residual stream.
  // ready_flag: the partial is behind this device flag (ExpertBackend::output_ready_flag),
  // which the combine waits for itself; null when the partial is ready in stream order.
  virtual absl::Status Combine(const Tensor& partial, const uint32_t* ready_flag) = 0;

  // A guess at MoE layer `layer`'s routing from the residual stream as it is now (its norm and
  // gate without its attention), for prefetching that layer's experts; the step is unchanged.
  virtual absl::Status PredictRouting(int layer, float temperature, RoutingTable& predicted) = 0;
  // The expert ids of the device routing PredictRouting last made, into `host` (weights
  // zero), for the workers' prefetch hints: waits for the step's work queued so far. Host
  // backends predict on the host.
  virtual absl::Status ReadPredictedRouting(RoutingTable& host) {
    return absl::UnimplementedError("this router backend predicts routing on the host");
  }

  // A backend that predicts into device routing scores its guesses where they are, when the
  // predicted layer's gate has run: picks predicted, those the gate then made, the gate's
  // picks, since start, as of the last finished step. Zeros for a host backend (ForwardPass
  // scores host predictions itself).
  // Resizes the KV pool (PagedKvCache::Resize) with the memory under it, between steps: a
  // device backend maps a grown pool's memory first (RESOURCE_EXHAUSTED, nothing changed, when
  // the device has not the memory) and gives a shrunk pool's tail back once its blocks moved.
  virtual absl::StatusOr<int64_t> ResizeKv(PagedKvCache& kv, int blocks) {
    return kv.Resize(blocks);
  }

  struct PredictionCounts {
    uint64_t predicted = 0, correct = 0, actual = 0;
  };
  virtual PredictionCounts DevicePredictionCounts() const { return {}; }

  // logits[r] = lm_head(final_norm(residual[rows[r]])); `logits` is resized to
  // [rows.size(), vocab].
  virtual absl::Status Logits(absl::Span<const int64_t> rows, Tensor& logits) = 0;

  // While an FP8 KV cache is calibrating (PagedKvCache::calibrating), the backend notes the
  // largest key and value magnitudes each step writes; this hands them to the cache
  // (PagedKvCache::ObserveKvRange) after the step.
  virtual absl::Status ReportKvRange(PagedKvCache& kv) = 0;

  // What a backend on a GPU offers beyond this interface (decode-step graphs, its device
  // context, the hand-off to CUDA IPC workers); null on the CPU.
  virtual gpu::DeviceRouter* device_router() { return nullptr; }
};

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;

  // out[t] = sum over the slots s of token t with expert id >= 0 of
  //          weight[t][s] * expert[t][s](x[t]).
  // `out` is resized to x's shape; tokens with no slot of this backend get zeros.
  virtual absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                                  Tensor& out) = 0;

  // A hint that `layer` will soon run the experts of `predicted`: a backend whose experts are
  // not all resident may start loading them. The default ignores it.
  virtual void Prefetch(int layer, const RoutingTable& predicted) {}
  // Whether Prefetch does anything: when not, the forward pass skips the prediction.
  virtual bool wants_prefetch() const { return false; }

  // A flag in device memory (a uint32 the other side sets to 1 or more) that the last
  // RunExperts's device output is behind, left for the combine to wait on; null when the
  // output is ready in stream order.
  virtual const uint32_t* output_ready_flag() const { return nullptr; }

  // Called once a step's logits are on the host. ABORTED means the step's device work may be
  // wrong (e.g. a worker died after answering, its work still queued) and the step must run
  // again; the default has nothing to check.
  virtual absl::Status FinishStep() { return absl::OkStatus(); }

  // The backend's part in a router's decode-step graphs (graph_step.h); null when its work
  // cannot be captured (host activations, a message per layer).
  virtual GraphStepExperts* graph_steps() { return nullptr; }

  // Its experts on a GPU, run on raw device arrays (CUDA IPC buffers); null when it has none.
  virtual gpu::DeviceExperts* device_experts() { return nullptr; }
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_BACKEND_H_
