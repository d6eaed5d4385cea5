// The model's compute stack in one process: its weights, the router backend (the CPU reference
// or one GPU), the paged KV cache (keys and values on the GPU, or in host memory on the CPU)
// and, unless the experts run in other processes, an expert backend on the same device.
// LocalEngine and strata-router build it here, so both take the same devices the same way.
#ifndef STRATA_COMMON_ENGINE_MODEL_STACK_H_
#define STRATA_COMMON_ENGINE_MODEL_STACK_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_weights.h"
#include "common/util/thread_pool.h"

namespace strata {

struct ModelStackOptions {
  // "cpu" (the float32 reference) or "cuda" / "cuda:N" (bf16 on a GPU, when built with CUDA).
  std::string device = "cpu";
  int num_threads = 0;  // CPU: 0 is one per hardware thread
  // The KV cache's options. prefix_caching only keeps the blocks: a caller that matches and
  // commits prompts (the router's scheduler) shares them.
  KvCacheOptions kv;
  // No more blocks than one sequence of the model's whole context needs (one sequence at a
  // time); a server shares the pool among sequences and leaves this off.
  bool kv_within_context = true;
  int kv_blocks = 0;  // when positive, exactly this many blocks (tests), whatever the bytes
  // The pool may grow at run time (PagedKvCache::Resize), beyond the blocks it starts with, by
  // this share of the model's expert bytes: memory lent by expert slots (docs/tiers.md).
  float kv_growth_expert_share = 0.0f;
  int max_step_tokens = 512;  // GPU: tokens in one forward step (sizes the buffers)
  int max_sequences = 1;      // GPU: sequences in one step
  // Build an expert backend here; off when the experts run in worker processes.
  bool local_experts = true;
  // On a GPU: bf16, or fp8 (FP8 E4M3 experts and attention projections, quantized at load;
  // gate, embedding and lm_head stay bf16).
  std::string expert_weights = "bf16";
  // The attention projections' format when it differs ("bf16" or "fp8"); empty follows
  // expert_weights.
  std::string attention_weights;
  // Progress lines while a large model goes to the GPU.
  std::function<void(const std::string&)> on_progress;
};

class ModelStack {
 public:
  static absl::StatusOr<std::unique_ptr<ModelStack>> Create(const std::string& model_dir,
                                                            const ModelStackOptions& options);
  ~ModelStack();

  const Model& model() const { return *model_; }
  const ModelConfig& config() const { return model_->config; }
  RouterBackend& router() { return *router_; }
  // Null without local experts.
  ExpertBackend* experts() { return experts_.get(); }
  PagedKvCache& kv() { return *kv_; }
  // The GPU's index, or -1 on the CPU.
  int device_index() const { return device_index_; }
  // Makes the stack's GPU current on the calling thread (a thread that did not build the
  // stack must, before its first step); a no-op on the CPU.
  absl::Status BindThread() const;

 private:
  ModelStack() = default;
  // An FP8 cache's scales from the checkpoint (`model.layers.N.self_attn.k_scale` / `v_scale`,
  // one per layer or per KV head, as vLLM's FP8 checkpoints have them); without them the cache
  // calibrates at run time.
  absl::Status LoadKvScales();
  absl::Status CreateKv();
  absl::Status CreateCpuBackends();
  absl::Status CreateCudaBackends();

  ModelStackOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PagedKvCache> kv_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ModelExpertSource> expert_source_;
  int device_index_ = -1;
  // Declared before the backends: they go first, while the context still exists.
  std::shared_ptr<void> device_context_;
  std::unique_ptr<RouterBackend> router_;
  std::unique_ptr<ExpertBackend> experts_;
};

// "cuda" -> 0, "cuda:N" -> N; -1 for "cpu"; INVALID_ARGUMENT for anything else.
absl::StatusOr<int> ParseDevice(const std::string& device);

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_MODEL_STACK_H_
