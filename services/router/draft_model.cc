#include "services/router/draft_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"

namespace strata {
namespace {

int32_t Argmax(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Create(const DraftModelOptions& options,
                                                               int64_t vocab_size) {
  LocalEngineOptions engine;
  engine.model_dir = options.model_dir;
  engine.num_threads = options.num_threads;
  engine.kv.memory_mb = options.kv_cache_mb;
  engine.kv_within_context = false;
  engine.prefill_chunk_tokens = 512;  // catch-up tokens a draft step at most
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> made, LocalEngine::Create(engine));
  if (made->config().vocab_size != vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the draft model ", options.model_dir, " has a vocabulary of ", made->config().vocab_size,
        " tokens; the model it drafts for has ", vocab_size, " (they must share the tokenizer)"));
  }
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(made)));
}

std::vector<int32_t> DraftModel::Draft(uint64_t key, absl::Span<const int32_t> tokens,
                                       int max_tokens) {
  if (tokens.empty() || max_tokens <= 0) return {};
  auto [it, added] = states_.try_emplace(key);
  State& state = it->second;
  if (added) {
    state.seq = engine_->AddSequence();
    recent_.push_front(key);
  } else {
    recent_.splice(recent_.begin(), recent_, state.recent);
  }
  state.recent = recent_.begin();
  absl::StatusOr<std::vector<int32_t>> draft = Propose(state, tokens, max_tokens);
  // Short of blocks: the least recently drafted sequences give theirs back, and it goes again.
  while (absl::IsResourceExhausted(draft.status()) && recent_.back() != key) {
    Forget(recent_.back());
    draft = Propose(state, tokens, max_tokens);
  }
  if (!draft.ok()) {
    Log(LogLevel::kDebug, absl::StrCat("draft model: ", draft.status().message()));
    Forget(key);
    return {};
  }
  return *std::move(draft);
}

void DraftModel::Forget(uint64_t key) {
  const auto it = states_.find(key);
  if (it == states_.end()) return;
  engine_->ReleaseSequence(it->second.seq);
  recent_.erase(it->second.recent);
  states_.erase(it);
}

absl::StatusOr<int32_t> DraftModel::Next(State& state, absl::Span<const int32_t> ids,
                                         int64_t start) {
  ASSIGN_OR_RETURN(const StepResult step, engine_->RunChunked(state.seq, ids, start));
  state.computed.insert(state.computed.end(), ids.begin(), ids.end());
  return Argmax(step.logits(0), engine_->config().vocab_size);
}

absl::StatusOr<std::vector<int32_t>> DraftModel::Propose(State& state,
                                                         absl::Span<const int32_t> tokens,
                                                         int max_tokens) {
  const int64_t n = std::ssize(tokens);
  if (n + max_tokens > engine_->max_sequence_tokens()) return std::vector<int32_t>{};
  // What the cache holds that still stands: the common prefix with the sequence now (drafts
  // the target rejected fall away), less the last token, whose logits are needed.
  const auto mismatch =
      std::mismatch(state.computed.begin(), state.computed.end(), tokens.begin(), tokens.end());
  const int64_t keep =
      std::min<int64_t>(std::distance(state.computed.begin(), mismatch.first), n - 1);
  state.computed.resize(keep);
  std::vector<int32_t> draft;
  ASSIGN_OR_RETURN(int32_t next, Next(state, tokens.subspan(keep), keep));
  draft.push_back(next);
  while (static_cast<int>(draft.size()) < max_tokens) {
    const int32_t last = draft.back();
    ASSIGN_OR_RETURN(next, Next(state, absl::MakeConstSpan(&last, 1), n + std::ssize(draft) - 1));
    draft.push_back(next);
  }
  return draft;
}

}  // namespace strata
