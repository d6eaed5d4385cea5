#include "common/engine/local_engine.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#if STRATA_HAVE_CUDA
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/backend/cuda/cuda_router_backend.h"
#endif
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
  kv.host_storage = options.device == "cpu";
  ASSIGN_OR_RETURN(PagedKvCache cache, PagedKvCache::Create(kv));
  engine->kv_.emplace(std::move(cache));
  engine->expert_source_ = std::make_unique<ModelExpertSource>(engine->model_->weights);
  RETURN_IF_ERROR(engine->CreateBackends(kv));
  engine->forward_ =
      std::make_unique<ForwardPass>(c, *engine->router_, *engine->experts_,
                                    ForwardOptions{.router_temperature = options.router_temperature,
                                                   .on_routing = options.on_routing});
  return engine;
}

absl::Status LocalEngine::CreateBackends(const KvCacheOptions& kv) {
  const ModelConfig& c = model_->config;
  if (options_.device == "cpu") {
    pool_ = std::make_unique<ThreadPool>(options_.num_threads);
    router_ = std::make_unique<CpuRouterBackend>(*model_, *pool_);
    experts_ = std::make_unique<CpuExpertBackend>(c, *expert_source_, *pool_);
    return absl::OkStatus();
  }
  if (options_.device != "cuda" && options_.device.rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", options_.device, "\": use cpu, cuda or cuda:N"));
  }
  if (options_.expert_weights != "bf16" && options_.expert_weights != "fp8") {
    return absl::InvalidArgumentError("expert weights must be bf16 or fp8");
  }
#if STRATA_HAVE_CUDA
  gpu::CudaContext::Options context_options;
  if (options_.device.size() > 5) context_options.device = std::stoi(options_.device.substr(5));
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaContext> context,
                   gpu::CudaContext::Create(context_options));
  gpu::CudaContext* raw = context.get();
  device_context_ = std::shared_ptr<gpu::CudaContext>(std::move(context));
  const int max_tokens = std::max(options_.prefill_chunk_tokens, 1);
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaRouterBackend> cuda_router,
                   gpu::CudaRouterBackend::Create(*model_, kv, raw,
                                                  {.max_tokens = max_tokens, .max_sequences = 1}));
  cuda_router_ = cuda_router.get();
  router_ = std::move(cuda_router);
  gpu::CudaExpertOptions expert_options;
  expert_options.format =
      options_.expert_weights == "fp8" ? gpu::WeightFormat::kFp8E4M3 : gpu::WeightFormat::kBf16;
  expert_options.max_tokens = max_tokens;
  if (options_.on_progress) {
    expert_options.on_layer = [this](int layer, int layers, uint64_t bytes) {
      options_.on_progress(absl::StrCat("experts of layer ", layer + 1, "/", layers,
                                        " on the GPU (", bytes >> 20, " MiB)"));
    };
  }
  ASSIGN_OR_RETURN(
      experts_, gpu::CudaExpertBackend::Create(c, *expert_source_, raw, std::move(expert_options)));
  return absl::OkStatus();
#else
  return absl::UnimplementedError("this build has no CUDA backend (nvcc was not found)");
#endif
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
  const float* row_logits = logits.row(0);
  // Decode steps replay one CUDA graph when the whole sequence fits the graph's context.
  const bool graphs = UseDecodeGraph(n + options.max_new_tokens);
  absl::Cleanup leave_graph_mode = [&] {
    if (graphs) EndDecodeGraphs();
  };
  while (true) {
    const int32_t next = sampler.Sample(row_logits, vocab);
    out.push_back(next);
    if (options.on_token) options.on_token(next);
    const bool is_eos = std::find(eos.begin(), eos.end(), next) != eos.end();
    if (static_cast<int>(out.size()) >= options.max_new_tokens || (is_eos && !options.ignore_eos)) {
      break;
    }
    const int64_t position = n + static_cast<int64_t>(out.size()) - 1;
    if (graphs) {
      ASSIGN_OR_RETURN(row_logits, DecodeWithGraph(seq, next, position));
      continue;
    }
    const int64_t row = 0;
    RETURN_IF_ERROR(Step(seq, {&next, 1}, position, {&row, 1}, logits));
    row_logits = logits.row(0);
  }
  return out;
}

#if STRATA_HAVE_CUDA
struct LocalEngine::DecodeGraph {
  cudaGraphExec_t exec = nullptr;
  ~DecodeGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

bool LocalEngine::UseDecodeGraph(int64_t total_tokens) {
  if (cuda_router_ == nullptr || !options_.cuda_graphs) return false;
  const int64_t context = std::min<int64_t>(max_sequence_tokens(), kDecodeGraphContext);
  if (total_tokens > context) return false;
  return cuda_router_->EnterGraphMode(static_cast<int>(context)).ok();
}

void LocalEngine::EndDecodeGraphs() { cuda_router_->LeaveGraphMode(); }

absl::StatusOr<const float*> LocalEngine::DecodeWithGraph(PagedKvCache::SequenceId seq,
                                                          int32_t token, int64_t position) {
  RETURN_IF_ERROR(kv_->Reserve(seq, position + 1));
  cudaStream_t stream = cuda_router_->context()->stream();
  if (decode_graph_ == nullptr) {
    // Capture one decode step: the host code runs once, the device work is recorded.
    BatchLayout batch;
    batch.sequence = {seq};
    batch.position = {position};
    const int64_t row = 0;
    Tensor unused;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      return absl::InternalError("cannot begin capturing the decode graph");
    }
    const absl::Status captured = forward_->Run({&token, 1}, batch, *kv_, {&row, 1}, unused);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!captured.ok()) return captured;
    if (ended != cudaSuccess) {
      return absl::InternalError(absl::StrCat("decode graph capture: ", cudaGetErrorString(ended)));
    }
    auto owned = std::make_unique<DecodeGraph>();
    const cudaError_t made = cudaGraphInstantiate(&owned->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) {
      return absl::InternalError(absl::StrCat("decode graph: ", cudaGetErrorString(made)));
    }
    decode_graph_ = std::move(owned);
  }
  const std::vector<int>& table = kv_->block_table(seq);
  cuda_router_->WriteDecodeInputs(token, static_cast<int32_t>(position), table);
  if (cudaGraphLaunch(decode_graph_->exec, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return absl::InternalError("decode graph replay failed");
  }
  return cuda_router_->decode_logits();
}
#else
struct LocalEngine::DecodeGraph {};
bool LocalEngine::UseDecodeGraph(int64_t) { return false; }
void LocalEngine::EndDecodeGraphs() {}
absl::StatusOr<const float*> LocalEngine::DecodeWithGraph(PagedKvCache::SequenceId, int32_t,
                                                          int64_t) {
  return absl::UnimplementedError("no CUDA in this build");
}
#endif

LocalEngine::~LocalEngine() = default;

}  // namespace strata
