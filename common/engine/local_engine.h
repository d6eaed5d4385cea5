// The whole model in one process on the CPU reference backends: load, teacher-forced
// logits, and generation for one sequence at a time.
#ifndef STRATA_COMMON_ENGINE_LOCAL_ENGINE_H_
#define STRATA_COMMON_ENGINE_LOCAL_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/model_stack.h"
#include "common/engine/sampler.h"
#include "common/engine/step_runner.h"

namespace strata {

struct LocalEngineOptions {
  std::string model_dir;
  int num_threads = 0;  // 0: one per hardware thread
  // The KV cache's options but prefix_caching, which stays off: nothing here matches prompts
  // against the blocks it would keep.
  KvCacheOptions kv;
  int prefill_chunk_tokens = 512;  // prompt tokens per forward step
  // The pool holds one sequence of the model's context at most (one sequence at a time); off,
  // kv.memory_mb alone sizes it (sequences of one's own, RunStep).
  bool kv_within_context = true;
  float gate_temperature = 1.0f;
  // "cpu" (the float32 reference) or "cuda" / "cuda:N" (bf16 on a GPU, when built with CUDA).
  std::string device = "cpu";
  // Weights on a GPU: "bf16" or "fp8" (E4M3 experts and attention projections, per-output-channel
  // scales, at load).
  std::string expert_weights = "bf16";
  // The attention projections' format when it differs from expert_weights (comparisons).
  std::string attention_weights;
  // On a GPU, replay one CUDA graph per decode step (no per-kernel launch cost).
  bool cuda_graphs = true;
  // Greedy decoding by replay: launch the next step before the last one's token is read (its
  // token the argmax still on the GPU; StepPlan::launch_next), so the GPU never waits for the
  // host between steps.
  bool overlap_decode_steps = true;
  // Progress lines while a large model goes to the GPU.
  std::function<void(const std::string&)> on_progress;
  // Sees the routing of every MoE layer of every step (see ForwardOptions).
  std::function<void(int layer, const RoutingTable& routing)> on_routing;
};

struct GenerateOptions {
  int max_new_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;  // keep going past an EOS token
  // Called with each new token as soon as it is sampled (streaming, timing).
  std::function<void(int32_t)> on_token;
};

class LocalEngine {
 public:
  ~LocalEngine();
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(const LocalEngineOptions& options);

  // Logits for every position of `ids`, computed in one pass: [ids.size(), vocab].
  absl::StatusOr<Tensor> Logits(absl::Span<const int32_t> ids);

  // New token ids after `prompt`; stops at max_new_tokens or, unless ignored, EOS (which is
  // included in the output).
  absl::StatusOr<std::vector<int32_t>> Generate(absl::Span<const int32_t> prompt,
                                                const GenerateOptions& options);

  // Steps a caller plans itself (benchmarks of step shapes, such as a speculative verify step
  // of k tokens; a draft model): a sequence of its own, one step of `ids` at positions [start,
  // start + ids.size()) with every row's logits on the host (or the last row's only), and the
  // sequence's release.
  PagedKvCache::SequenceId AddSequence() { return kv_->AddSequence(); }
  PagedKvCache& kv() { return *kv_; }
  absl::StatusOr<StepResult> RunStep(PagedKvCache::SequenceId seq, absl::Span<const int32_t> ids,
                                     int64_t start, bool last_row_only = false);
  void ReleaseSequence(PagedKvCache::SequenceId seq) { kv_->Release(seq); }
  // `ids` at [start, ...) of `seq` in steps of at most prefill_chunk_tokens, the last row's
  // logits only: the last step's result (its row 0).
  absl::StatusOr<StepResult> RunChunked(PagedKvCache::SequenceId seq, absl::Span<const int32_t> ids,
                                        int64_t start);

  const ModelConfig& config() const { return stack_->config(); }
  // Longest sequence the KV pool and the model's context allow.
  int64_t max_sequence_tokens() const;
  // Where the replayed decode steps' host time went (all zero without decode graphs).
  DecodeGraphs::Timing decode_graph_timing() const { return runner_->stats().graph_timing; }

 private:
  LocalEngine() = default;
  absl::Status ValidatePrompt(absl::Span<const int32_t> ids, int64_t extra_tokens) const;
  // Runs `ids` at positions [start, start + ids.size()) of `seq` (reserving them, and one more
  // when `launch_next`); the logits of the rows asked for, or their tokens picked on the device
  // as `sampling` (StepPlan::sampling) says.
  absl::StatusOr<StepResult> Step(PagedKvCache::SequenceId seq, absl::Span<const int32_t> ids,
                                  int64_t start, std::vector<int64_t> logit_rows,
                                  std::vector<int64_t> host_rows, bool launch_next,
                                  std::vector<RowSampling> sampling = {});

  LocalEngineOptions options_;
  std::unique_ptr<ModelStack> stack_;
  PagedKvCache* kv_ = nullptr;  // the stack's
  std::unique_ptr<StepRunner> runner_;
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_LOCAL_ENGINE_H_
