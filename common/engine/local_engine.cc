#include "common/engine/local_engine.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const LocalEngineOptions& options) {
  if (options.prefill_chunk_tokens <= 0) {
    return absl::InvalidArgumentError("prefill_chunk_tokens must be positive");
  }
  if (!(options.router_temperature > 0.0f)) {
    return absl::InvalidArgumentError("router_temperature must be positive");
  }
  std::unique_ptr<LocalEngine> engine(new LocalEngine());
  engine->options_ = options;
  ASSIGN_OR_RETURN(engine->model_, LoadModel(options.model_dir));
  const ModelConfig& c = engine->model_->config;

  KvCacheOptions kv;
  kv.block_size = options.kv_block_size;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  if (kv.block_size <= 0) return absl::InvalidArgumentError("kv_cache.block_size must be positive");
  const int64_t block_bytes = KvBlockBytes(kv);
  const int64_t context_blocks = (c.max_position_embeddings + kv.block_size - 1) / kv.block_size;
  kv.num_blocks = static_cast<int>(std::min(options.kv_cache_bytes / block_bytes, context_blocks));
  if (kv.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache budget of ", options.kv_cache_bytes,
                                                   " bytes holds no block; one block needs ",
                                                   block_bytes));
  }
  ASSIGN_OR_RETURN(PagedKvCache cache, PagedKvCache::Create(kv));
  engine->kv_.emplace(std::move(cache));

  engine->pool_ = std::make_unique<ThreadPool>(options.num_threads);
  engine->router_ = std::make_unique<CpuRouterBackend>(*engine->model_, *engine->pool_);
  engine->expert_source_ = std::make_unique<ModelExpertSource>(engine->model_->weights);
  engine->experts_ = std::make_unique<CpuExpertBackend>(c, *engine->expert_source_, *engine->pool_);
  engine->forward_ = std::make_unique<ForwardPass>(
      c, *engine->router_, *engine->experts_,
      ForwardOptions{.router_temperature = options.router_temperature,
                     .on_routing = options.on_routing});
  return engine;
}

int64_t LocalEngine::max_sequence_tokens() const {
  const int64_t pool_tokens = int64_t{kv_->options().num_blocks} * kv_->options().block_size;
  return std::min(pool_tokens, model_->config.max_position_embeddings);
}

absl::Status LocalEngine::ValidatePrompt(absl::Span<const int32_t> ids,
                                         int64_t extra_tokens) const {
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= model_->config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     model_->config.vocab_size, ")"));
    }
  }
  const int64_t total = static_cast<int64_t>(ids.size()) + extra_tokens;
  if (total > max_sequence_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " prompt tokens + ", extra_tokens,
                                                   " new tokens exceed the ", max_sequence_tokens(),
                                                   "-token context"));
  }
  return absl::OkStatus();
}

absl::Status LocalEngine::Step(PagedKvCache::SequenceId seq, absl::Span<const int32_t> ids,
                               int64_t start, absl::Span<const int64_t> logit_rows,
                               Tensor& logits) {
  const int64_t n = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(kv_->Reserve(seq, start + n));
  BatchLayout batch;
  batch.sequence.assign(n, seq);
  batch.position.resize(n);
  for (int64_t i = 0; i < n; ++i) batch.position[i] = start + i;
  return forward_->Run(ids, batch, *kv_, logit_rows, logits);
}

absl::StatusOr<Tensor> LocalEngine::Logits(absl::Span<const int32_t> ids) {
  RETURN_IF_ERROR(ValidatePrompt(ids, 0));
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = model_->config.vocab_size;
  const PagedKvCache::SequenceId seq = kv_->AddSequence();
  absl::Cleanup release = [&] { kv_->Release(seq); };
  Tensor all = Tensor::Host(n, vocab);
  Tensor chunk_logits;
  std::vector<int64_t> rows;
  for (int64_t start = 0; start < n; start += options_.prefill_chunk_tokens) {
    const int64_t len = std::min<int64_t>(options_.prefill_chunk_tokens, n - start);
    rows.resize(len);
    for (int64_t i = 0; i < len; ++i) rows[i] = i;
    RETURN_IF_ERROR(Step(seq, ids.subspan(start, len), start, rows, chunk_logits));
    std::copy(chunk_logits.data(), chunk_logits.data() + len * vocab, all.row(start));
  }
  return all;
}

absl::StatusOr<std::vector<int32_t>> LocalEngine::Generate(absl::Span<const int32_t> prompt,
                                                           const GenerateOptions& options) {
  if (options.max_new_tokens <= 0) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  RETURN_IF_ERROR(ValidatePrompt(prompt, options.max_new_tokens));
  const int64_t vocab = model_->config.vocab_size;
  const PagedKvCache::SequenceId seq = kv_->AddSequence();
  absl::Cleanup release = [&] { kv_->Release(seq); };
  Sampler sampler(options.sampling);
  Tensor logits;
  // Prefill in chunks; only the last prompt position's logits are needed.
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (int64_t start = 0; start < n; start += options_.prefill_chunk_tokens) {
    const int64_t len = std::min<int64_t>(options_.prefill_chunk_tokens, n - start);
    const int64_t last_row = len - 1;
    RETURN_IF_ERROR(Step(seq, prompt.subspan(start, len), start, {&last_row, 1}, logits));
  }
  std::vector<int32_t> out;
  const std::vector<int>& eos = model_->config.eos_token_ids;
  while (true) {
    const int32_t next = sampler.Sample(logits.row(0), vocab);
    out.push_back(next);
    const bool is_eos = std::find(eos.begin(), eos.end(), next) != eos.end();
    if (static_cast<int>(out.size()) >= options.max_new_tokens || (is_eos && !options.ignore_eos)) {
      break;
    }
    const int64_t row = 0;
    RETURN_IF_ERROR(
        Step(seq, {&next, 1}, n + static_cast<int64_t>(out.size()) - 1, {&row, 1}, logits));
  }
  return out;
}

}  // namespace strata
