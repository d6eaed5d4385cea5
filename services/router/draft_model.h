// Speculative decoding with a draft model: a small model of the same vocabulary, run in the
// router's process on the CPU, proposes the next tokens greedily; the target model verifies them
// in one step (Scheduler, Sampler::AcceptDraft: exact for sampling, the greedy draft being a
// point mass). Each sequence keeps its draft keys and values between steps: a call runs only
// the tokens since the last one (the accepted drafts and the target's token) and the drafts.
#ifndef STRATA_SERVICES_ROUTER_DRAFT_MODEL_H_
#define STRATA_SERVICES_ROUTER_DRAFT_MODEL_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/engine/local_engine.h"
#include "services/router/speculation.h"

namespace strata {

struct DraftModelOptions {
  std::string model_dir;
  int num_threads = 1;
  int64_t kv_cache_mb = 64;  // the draft's keys and values, every sequence's
};

class DraftModel : public DraftSource {
 public:
  // InvalidArgument when its vocabulary is not `vocab_size` (the target's).
  static absl::StatusOr<std::unique_ptr<DraftModel>> Create(const DraftModelOptions& options,
                                                            int64_t vocab_size);

  // A failure (the pool is short even after the least recently drafted sequences gave their
  // blocks back, a bad token) drafts nothing: the step runs without a draft.
  std::vector<int32_t> Draft(uint64_t key, absl::Span<const int32_t> tokens,
                             int max_tokens) override;
  void Forget(uint64_t key) override;

  const ModelConfig& config() const { return engine_->config(); }
  // Sequences whose draft keys and values are kept.
  int sequences() const { return static_cast<int>(states_.size()); }

 private:
  struct State {
    PagedKvCache::SequenceId seq = 0;
    std::vector<int32_t> computed;  // the tokens whose keys and values the draft cache holds
    std::list<uint64_t>::iterator recent;
  };
  explicit DraftModel(std::unique_ptr<LocalEngine> engine) : engine_(std::move(engine)) {}
  absl::StatusOr<std::vector<int32_t>> Propose(State& state, absl::Span<const int32_t> tokens,
                                               int max_tokens);
  // The greedy token after running `ids` at [start, ...) of the state's sequence.
  absl::StatusOr<int32_t> Next(State& state, absl::Span<const int32_t> ids, int64_t start);

  std::unique_ptr<LocalEngine> engine_;
  absl::flat_hash_map<uint64_t, State> states_;
  std::list<uint64_t> recent_;  // keys, most recently drafted first
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_DRAFT_MODEL_H_
