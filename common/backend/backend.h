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

class RouterBackend {
 public:
  virtual ~RouterBackend() = default;

  // hidden[t] = embedding of ids[t]. `hidden` is resized to [ids.size(), hidden_size].
  virtual absl::Status Embed(absl::Span<const int32_t> ids, Tensor& hidden) = 0;

  // hidden += o_proj(attention(input_norm(hidden))) for every token of `batch`, writing the
  // tokens' keys and values into `kv` first (their positions must be reserved). A device
  // backend may leave the residual add to the PrepareFfn call that follows (fused with its
  // norm and gate): `hidden` is whole only after it.
  virtual absl::Status Attention(int layer, const BatchLayout& batch, PagedKvCache& kv,
                                 Tensor& hidden) = 0;

  // ffn_input = post_attention_norm(hidden). On MoE layers also fills `routing` with the
  // top-k experts and weights, the gate logits divided by `temperature` first.
  virtual absl::Status PrepareFfn(int layer, const Tensor& hidden, float temperature,
                                  Tensor& ffn_input, RoutingTable& routing) = 0;

  // hidden += the layer's dense MLP (dense layers) or gated shared expert (MoE layers that
  // have one) of ffn_input; a no-op for MoE layers without a shared expert.
  virtual absl::Status DenseFfn(int layer, const Tensor& ffn_input, Tensor& hidden) = 0;

  // hidden += partial: the combine of the experts' weighted outputs into the residual stream.
  // ready_flag: the partial is behind this device flag (ExpertBackend::output_ready_flag),
  // which the combine waits for itself; null when the partial is ready in stream order.
  virtual absl::Status Combine(const Tensor& partial, const uint32_t* ready_flag,
                               Tensor& hidden) = 0;

  // logits[r] = lm_head(final_norm(hidden[rows[r]])); `logits` is resized to
  // [rows.size(), vocab].
  virtual absl::Status Logits(const Tensor& hidden, absl::Span<const int64_t> rows,
                              Tensor& logits) = 0;
};

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;

  // out[t] = sum over the slots s of token t with expert id >= 0 of
  //          weight[t][s] * expert[t][s](x[t]).
  // `out` is resized to x's shape; tokens with no slot of this backend get zeros.
  virtual absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                                  Tensor& out) = 0;

  // A hint that `layer` will soon run the experts of `predicted` (host routing): a backend
  // whose experts are not all resident may start loading them. The default ignores it.
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

  // Decode-step CUDA graphs. 0 when this backend's work cannot be captured in the router's
  // graph; otherwise a version that changes whenever a captured step would be stale (e.g. a
  // worker came or went), so the caller captures again.
  virtual uint64_t graph_version() const { return 0; }
  // Called before each replay of a captured step of `tokens` tokens is launched (e.g. to start
  // the workers' own graphs); an error means the step must run without the graph. A replay
  // may be begun and launched while the one before it is still in flight (after that one's
  // AwaitGraphStep); FinishStep then closes them in the order they were launched.
  virtual absl::Status BeginGraphStep(int64_t tokens) { return absl::OkStatus(); }
  // Called once the replay is launched, to confirm what BeginGraphStep started. An error means
  // the replay computes garbage: the backend has released whatever the replay waits for, and
  // the caller lets it finish, then runs the step without the graph.
  virtual absl::Status AwaitGraphStep() { return absl::OkStatus(); }
  // Called instead of a replay that could not be launched after BeginGraphStep succeeded:
  // whatever BeginGraphStep started must not wait for it.
  virtual void AbortGraphStep() {}
  // The caller brackets the capture of a decode step with true and false: a backend whose
  // captured exchanges differ from eager ones (flags on the device instead of messages)
  // records the step being captured then.
  virtual void SetGraphCapture(bool capturing) {}
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_BACKEND_H_
