#include "services/router/router_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#if STRATA_HAVE_CUDA
#include "common/backend/cuda/device_router.h"
#include "services/router/ipc_expert_backend.h"
#endif
#include "common/placement/plan_file.h"
#include "common/util/counter_since.h"
#include "common/util/grpc_listen.h"
#include "common/util/process.h"
#include "common/util/read_file.h"
#include "common/util/status_macros.h"
#include "common/util/tunables.h"
#include "services/router/router_limits.h"

namespace strata {

namespace {

// The options a router cannot run with, each refused with its name before the model is loaded
// (the flags of a router started by hand reach here unchecked).
absl::Status CheckOptions(const RouterOptions& o) {
  const SchedulerOptions& s = o.scheduler;
  if (s.max_batch_tokens < 1) return absl::InvalidArgumentError("max_batch_tokens must be >= 1");
  if (s.max_running < 1) return absl::InvalidArgumentError("max_running must be >= 1");
  if (s.max_queued_requests < 0) {
    return absl::InvalidArgumentError("max_queued_requests must be >= 0");
  }
  if (s.max_context_tokens < 0) return absl::InvalidArgumentError("max_context must be >= 0");
  if (o.num_threads < 0 || o.num_threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be in [0, ", kMaxThreads, "]"));
  }
  if (o.kv.memory_mb <= 0 || o.kv.memory_mb > kMaxKvCacheMiB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV cache must have more than 0 bytes and at most ", kMaxKvCacheMiB, " MiB"));
  }
  if (o.max_request_bytes <= 0 || o.max_request_bytes > kMaxRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the largest request size must be in [1, ", kMaxRequestBytes, "]"));
  }
  if (!o.api_key.empty() && !IsApiKey(o.api_key)) {
    return absl::InvalidArgumentError(absl::StrCat("the API key must be 1 to ", kMaxApiKeyBytes,
                                                   " printable ASCII characters without spaces"));
  }
  if (o.internal_listen.empty()) {
    return absl::InvalidArgumentError("the router needs an internal listener (Coordinator, Admin)");
  }
  return CheckInternalListener("the internal listener", o.internal_listen, o.token);
}

// Structured output over this model's vocabulary; one that refuses every format, saying why,
// when the model or the build cannot have it.
std::unique_ptr<GrammarCompiler> CreateGrammarCompiler(const Tokenizer* tokenizer,
                                                       const ModelConfig& config) {
  if (tokenizer == nullptr) {
    return GrammarCompiler::Unavailable(
        absl::FailedPreconditionError("structured output needs the model's tokenizer "
                                      "(tokenizer.json or tiktoken.model), which it lacks"));
  }
  // The grammar engine reads how token strings map to bytes from tokenizer.json; a tiktoken
  // model's strings are byte-level, which it is told without one.
  std::string tokenizer_json;
  if (tokenizer->format() == Tokenizer::Format::kTokenizerJson) {
    absl::StatusOr<std::string> json = ReadFileToString(tokenizer->source_name());
    if (!json.ok()) return GrammarCompiler::Unavailable(json.status());
    tokenizer_json = *std::move(json);
  }
  absl::StatusOr<std::unique_ptr<GrammarCompiler>> compiler =
      GrammarCompiler::Create({.tokenizer = tokenizer,
                               .tokenizer_json = std::move(tokenizer_json),
                               .eos_token_ids = config.eos_token_ids,
                               .vocab_size = config.vocab_size});
  if (compiler.ok()) return *std::move(compiler);
  Log(LogLevel::kWarning, absl::StrCat("structured output is off: ", compiler.status().message()));
  return GrammarCompiler::Unavailable(compiler.status());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<RouterServer> s(new RouterServer());
  s->options_ = options;
  ModelStackOptions stack;
  stack.device = options.device;
  stack.num_threads = options.num_threads;
  stack.kv = options.kv;
  stack.kv_within_context = false;  // shared by the running sequences
  stack.max_step_tokens = std::max(options.scheduler.max_batch_tokens, 1);
  stack.max_sequences = std::max(options.scheduler.max_running, 1);
  stack.local_experts = options.num_workers == 0;
  stack.expert_weights = options.expert_weights;
  const bool lending = options.kv.share_expert_memory && options.num_workers > 0;
  if (lending) stack.kv_growth_expert_share = options.hot_ratio_policy.Highest();
  try {
    ASSIGN_OR_RETURN(s->stack_, ModelStack::Create(options.model_dir, stack));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("not enough memory for the model's weights and a KV cache of ",
                     options.kv.memory_mb, " MiB (kv_cache.memory_mb)"));
  }
  const ModelConfig& c = s->stack_->config();
  ASSIGN_OR_RETURN(s->tokenizer_, Tokenizer::FromModelDirIfAny(options.model_dir));
  s->grammar_ = CreateGrammarCompiler(s->tokenizer_.get(), c);

  // Channels an earlier router of this cluster made and was killed before its workers took.
  ShmChannel::RemoveOrphans(options.channel_prefix + "-w");
  CoordinatorOptions coordinator;
  coordinator.channel_prefix = options.channel_prefix;
  coordinator.max_tokens_per_step = options.scheduler.max_batch_tokens;
  coordinator.router_device = options.device;
  coordinator.heartbeat_timeout = options.worker_liveness_timeout;
  if (options.num_workers > 0) {
    PlacementPlan placement =
        PlacementPlan::Contiguous(c.num_layers, c.num_experts, options.num_workers);
    if (!options.plan_file.empty()) {
      ASSIGN_OR_RETURN(PlanFile plan, LoadPlan(options.plan_file, c.num_layers, c.num_experts,
                                               options.num_workers));
      placement = std::move(plan.plan);
      coordinator.calibration = std::move(plan.counts);
    }
    RETURN_IF_ERROR(s->CreateWorkerExperts(std::move(placement), coordinator));
    s->hot_ratio_ = std::make_unique<HotRatioControl>(options.hot_ratio_policy);
    if (options.hot_ratio >= 0.0f) RETURN_IF_ERROR(s->hot_ratio_->SetFixed(options.hot_ratio));
    s->worker_experts_->set_hot_ratio(s->hot_ratio_->Update(0));
    s->worker_experts_->set_fp8_activations(options.fp8_activations);
  }
  ExpertBackend& experts = s->worker_experts_ != nullptr
                               ? *s->worker_experts_
                               : static_cast<ExpertBackend&>(*s->stack_->experts());
  StepRunnerOptions runner;
  ForwardOptions& forward_options = runner.forward;
  forward_options.gate_temperature = options.gate_temperature;
  if (s->worker_experts_ != nullptr) {
    // Only while a worker keeps some experts cold (wants_prefetch). A GPU router predicts on
    // the device, for its accuracy (eager steps; CudaRouterBackend::PredictRouting).
    forward_options.predict_next_experts = options.prefetch;
    forward_options.prefetch_lookahead = options.prefetch ? options.prefetch_lookahead : 0;
    if (lending) {
      const PagedKvCache& kv = s->stack_->kv();
      s->lending_ = std::make_unique<KvLending>(
          KvLendingOptions{.top_ratio = options.hot_ratio_policy.Highest(),
                           .base_blocks = kv.active_blocks(),
                           .max_blocks = kv.options().num_blocks,
                           .block_bytes = static_cast<uint64_t>(KvBlockBytes(kv.options()))});
    }
    forward_options.on_batch = [server = s.get()](const BatchLayout& batch) {
      int64_t longest = 0;
      for (int64_t p : batch.position) longest = std::max(longest, p + 1);
      const float ratio = server->hot_ratio_->Update(longest);
      server->worker_experts_->set_hot_ratio(ratio);
      if (server->lending_ != nullptr) server->LendKvMemory(ratio);
    };
  }
  SchedulerOptions scheduler = options.scheduler;
  if (!options.draft_model_dir.empty()) {
    if (scheduler.speculation.max_draft_tokens <= 0) {
      return absl::InvalidArgumentError(
          "a speculative draft model drafts nothing without --speculative-tokens");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<DraftModel> draft,
                     DraftModel::Create({.model_dir = options.draft_model_dir}, c.vocab_size));
    scheduler.speculation.draft_model = std::move(draft);
  }
  runner.cuda_graphs = options.cuda_graph_max_batch > 0;
  runner.replay_or_eager.trials = GetTunables().step_trials;
  runner.graphs.max_sequences =
      std::min({options.cuda_graph_max_batch, stack.max_sequences, stack.max_step_tokens});
  // The pool's largest (it may grow: KvLending), for the graphs' block tables.
  const int64_t pool_tokens =
      int64_t{s->stack_->kv().options().num_blocks} * s->stack_->kv().options().cache.block_size;
  runner.graphs.max_context = static_cast<int>(
      std::min<int64_t>({int64_t{kDecodeGraphContext}, pool_tokens, c.max_position_embeddings}));
  // Clock stamps are read per step, with nothing behind it on the stream.
  if (!options.gpu_clock_stamps.empty()) scheduler.overlap_decode_steps = false;
  s->runner_ =
      CreateStepRunner(c, s->stack_->router(), experts, s->stack_->kv(), std::move(runner));
  scheduler.on_engine_thread = [stack = s->stack_.get()] {
    if (absl::Status bound = stack->BindThread(); !bound.ok()) {
      Log(LogLevel::kError, absl::StrCat("engine thread: ", bound.message()));
    }
  };
  s->scheduler_ =
      std::make_unique<Scheduler>(c, *s->runner_, s->stack_->kv(), s->tokenizer_.get(), scheduler);
  // Requests being prepared (parsed, tokenized): a few of the largest at once, two a client.
  const RequestBudgetOptions budget{.total_bytes = int64_t{4} * options.max_request_bytes,
                                    .per_client_bytes = int64_t{2} * options.max_request_bytes};
  s->generation_ = std::make_unique<GenerationService>(
      c, *s->scheduler_, s->tokenizer_.get(), options.num_workers, budget, s->grammar_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Clients: Generation, health and reflection, nothing that could change the cluster.
  grpc::ServerBuilder builder;
  builder.RegisterService(s->generation_.get());
  builder.SetMaxReceiveMessageSize(options.max_request_bytes);
  // A connection that never completes its HTTP/2 handshake, or stays idle, gives its
  // descriptor back: a flood of bare connections cannot hold them all.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 10 * 60'000);
  s->admin_ =
      std::make_unique<AdminService>(*s->scheduler_, s->stack_->kv(), *s->runner_,
                                     s->worker_experts_.get(), s->hot_ratio_.get(), options.token);
  // The cluster's own processes and its operators.
  grpc::ServerBuilder internal;
  internal.RegisterService(s->admin_.get());
  if (s->worker_experts_ != nullptr) {
    coordinator.token = options.token;
    s->coordinator_ =
        std::make_unique<CoordinatorService>(c, *s->worker_experts_, std::move(coordinator));
    internal.RegisterService(s->coordinator_.get());
  }
  ASSIGN_OR_RETURN(ListeningServer internal_listening,
                   StartListening(internal, options.internal_listen));
  s->internal_server_ = std::move(internal_listening.server);
  s->internal_address_ = std::move(internal_listening.address);
  ASSIGN_OR_RETURN(ListeningServer listening, StartListening(builder, options.listen));
  s->server_ = std::move(listening.server);
  s->address_ = std::move(listening.address);
  // The whole server ("") and the Generation service by name: NOT_SERVING until every worker
  // has registered.
  s->server_->GetHealthCheckService()->SetServingStatus("strata.v1.Generation", false);
  s->server_->GetHealthCheckService()->SetServingStatus(false);
  s->scheduler_->Start();
  s->monitor_ = std::thread([raw = s.get()] { raw->MonitorWorkers(); });
  if (options.http_port >= 0) RETURN_IF_ERROR(s->StartHttp());
  return s;
}

absl::Status RouterServer::StartHttp() {
  ASSIGN_OR_RETURN(ChatTemplate chat_template, ChatTemplate::FromModelDir(options_.model_dir));
  OpenAiServiceOptions service;
  service.model_name = options_.served_model_name;
  service.api_key = options_.api_key;
  ASSIGN_OR_RETURN(service.tool_call_format,
                   ChooseToolCallFormat(options_.tool_call_parser, chat_template));
  if (service.model_name.empty()) {
    service.model_name =
        std::filesystem::path(options_.model_dir).lexically_normal().filename().string();
  }
  if (service.model_name.empty()) {
    service.model_name = std::filesystem::path(options_.model_dir)
                             .lexically_normal()
                             .parent_path()
                             .filename()
                             .string();
  }
  service.snapshot = [this] { return Snapshot(); };
  service.ready = [this] { return ready(); };
  service.grammar = grammar_.get();
  openai_ = std::make_unique<OpenAiService>(std::move(service), stack_->config(), *scheduler_,
                                            tokenizer_.get(), std::move(chat_template));
  HttpServerOptions http = options_.http;
  http.host = options_.listen.substr(0, options_.listen.rfind(':'));
  if (http.host.size() >= 2 && http.host.front() == '[')
    http.host = http.host.substr(1, http.host.size() - 2);
  http.port = options_.http_port;
  ASSIGN_OR_RETURN(http_server_,
                   HttpServer::Start(http, [service = openai_.get()](const HttpRequest& request,
                                                                     HttpResponder& responder) {
                     service->Handle(request, responder);
                   }));
  return absl::OkStatus();
}

RouterSnapshot RouterServer::Snapshot() const {
  RouterSnapshot r;
  const Scheduler::Stats s = scheduler_->stats();
  r.waiting = s.waiting;
  r.running = s.running;
  r.kv_blocks_free = s.free_kv_blocks;
  r.kv_blocks_total = scheduler_->kv_pool_blocks();
  r.kv_blocks_borrowed = scheduler_->kv_borrowed_blocks();
  r.steps = s.steps;
  r.graph_steps = s.graph_steps;
  r.replay_or_eager = s.replay_or_eager;
  r.preemptions = s.preemptions;
  r.prompt_tokens_computed = s.prompt_tokens_computed;
  r.prefix_queried_tokens = s.prefix_queried_tokens;
  r.prefix_hit_tokens = s.prefix_hit_tokens;
  r.prefix_cached_blocks = s.prefix_cached_blocks;
  r.draft_tokens = s.draft_tokens;
  r.accepted_draft_tokens = s.accepted_draft_tokens;
  if (coordinator_ != nullptr) r.worker_restarts = coordinator_->restarts();
  const RouterBackend::PredictionCounts p = runner_->prefetch();
  r.prefetch_predicted = p.predicted;
  r.prefetch_correct = p.correct;
  r.prefetch_actual = p.actual;
  if (worker_experts_ != nullptr) {
    r.reroutes = worker_experts_->reroutes();
    r.expert_wire_bytes_sent = worker_experts_->wire_bytes().sent.load();
    r.expert_wire_bytes_received = worker_experts_->wire_bytes().received.load();
    for (int w = 0; w < worker_experts_->num_workers(); ++w) {
      const TierCounters t = worker_experts_->tiers(w);
      r.workers.push_back({.index = w,
                           .connected = worker_experts_->connected(w),
                           .hot_hits = t.hot_hits,
                           .warm_hits = t.warm_hits,
                           .misses = t.misses,
                           .prefetch_loads = t.prefetch_loads,
                           .prefetch_hits = t.prefetch_hits,
                           .lent_slots = t.lent_slots});
    }
  }
  return r;
}

absl::Status RouterServer::CreateWorkerExperts(PlacementPlan placement,
                                               CoordinatorOptions& coordinator) {
  const ModelConfig& c = stack_->config();
  const WorkerExpertOptions worker_options{.timeout = options_.expert_timeout,
                                           .kill_stalled_after = options_.worker_kill_after};
  owned_experts_.assign(placement.num_workers, 0);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (!c.layer_is_moe[layer]) continue;
    for (int w = 0; w < placement.num_workers; ++w) {
      owned_experts_[w] += static_cast<int>(placement.OwnedBy(layer, w).size());
    }
  }
  if (stack_->device_index() < 0) {
    worker_experts_ =
        std::make_unique<WorkerExpertBackend>(c, std::move(placement), worker_options);
    return absl::OkStatus();
  }
#if STRATA_HAVE_CUDA
  gpu::DeviceRouter* device = stack_->router().device_router();
  if (device == nullptr) return absl::InternalError("a GPU router without its device hooks");
  ASSIGN_OR_RETURN(
      std::unique_ptr<IpcExpertBackend> ipc,
      IpcExpertBackend::Create(c, std::move(placement), worker_options, device->context(),
                               std::max(options_.scheduler.max_batch_tokens, 1)));
  if (!options_.gpu_clock_stamps.empty()) {
    RETURN_IF_ERROR(ipc->StampClocks(options_.gpu_clock_stamps));
  }
  if (absl::StatusOr<std::string> uuid = gpu::GpuUuid(stack_->device_index()); uuid.ok()) {
    coordinator.router_gpu_uuid = *uuid;
  }
  coordinator.cuda_ipc = [ipc = ipc.get()](const v1::RegisterWorkerRequest& request,
                                           std::unique_ptr<ShmExpertConnection> channel,
                                           v1::CudaIpcBuffers& buffers) {
    return ipc->Attach(static_cast<int>(request.worker_index()), std::move(channel), buffers,
                       request.gpu_uuid(), !request.no_graph_steps());
  };
  // The router's gate kernel hands captured decode layers to the workers itself.
  device->SetGateHandOffSource(ipc.get());
  worker_experts_ = std::move(ipc);
  return absl::OkStatus();
#else
  return absl::UnimplementedError("this build has no CUDA backend (nvcc was not found)");
#endif
}

void RouterServer::LendKvMemory(float ratio) {
  const int n = worker_experts_->num_workers();
  std::vector<LendingWorker> workers(n);
  for (int w = 0; w < n; ++w) {
    const TierCounters t = worker_experts_->tiers(w);
    workers[w] = {.shares = worker_experts_->shares_memory(w) && worker_experts_->connected(w),
                  .owned = owned_experts_[w],
                  .slot_bytes = t.slot_bytes,
                  .lent = t.lent_slots};
  }
  const std::optional<int> resize = lending_->Step(ratio, workers, stack_->kv().active_blocks());
  for (int w = 0; w < n; ++w) worker_experts_->set_lent_slots(w, lending_->asks()[w]);
  if (!resize) return;
  // Applied between steps, on this thread (Scheduler::ResizeKv).
  scheduler_->ResizeKv(
      *resize, [lending = lending_.get()](absl::StatusOr<Scheduler::KvResize> done) {
        lending->ResizeDone(done.ok());
        if (!done.ok() && !absl::IsFailedPrecondition(done.status())) {
          Log(LogLevel::kWarning,
              absl::StrCat("KV pool resize for lent expert memory: ", done.status().message()));
        }
      });
}

void RouterServer::MonitorWorkers() {
  absl::Time last_report = absl::Now();
  RequestMetrics::Totals reported = scheduler_->metrics().totals();
  ExpertUses reported_uses = WorkerExpertUses();
  while (!stopping_.load()) {
    // A worker that stopped answering is noticed here even while no request runs.
    if (worker_experts_ != nullptr) worker_experts_->CheckWorkers();
    const bool all = worker_experts_ == nullptr ||
                     worker_experts_->num_connected() == worker_experts_->num_workers();
    if (all != ready_.load()) {
      ready_.store(all);
      server_->GetHealthCheckService()->SetServingStatus(all);
    }
    if (absl::Now() - last_report >= options_.throughput_log_interval) {
      ReportThroughput(absl::Now() - last_report, reported, reported_uses);
      last_report = absl::Now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ExpertUses RouterServer::WorkerExpertUses() const {
  ExpertUses uses;
  if (worker_experts_ == nullptr) return uses;
  for (int w = 0; w < worker_experts_->num_workers(); ++w) {
    const TierCounters t = worker_experts_->tiers(w);
    uses.hot += t.hot_hits;
    uses.warm += t.warm_hits;
    uses.cold += t.misses;
  }
  return uses;
}

void RouterServer::ReportThroughput(absl::Duration span, RequestMetrics::Totals& reported,
                                    ExpertUses& reported_uses) {
  const RequestMetrics::Totals now = scheduler_->metrics().totals();
  const Scheduler::Stats s = scheduler_->stats();
  const ExpertUses uses = WorkerExpertUses();
  const ThroughputState state{
      s.running,
      s.waiting,
      scheduler_->kv_pool_blocks() - s.free_kv_blocks,
      scheduler_->kv_pool_blocks(),
      {CounterSince(reported_uses.hot, uses.hot), CounterSince(reported_uses.warm, uses.warm),
       CounterSince(reported_uses.cold, uses.cold)}};
  if (Busy(reported, now, state)) {
    Log(LogLevel::kInfo, ThroughputLine(reported, now, absl::ToDoubleSeconds(span), state));
  }
  reported = now;
  reported_uses = uses;
}

bool RouterServer::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!ready_.load()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

bool RouterServer::Shutdown(absl::Duration timeout) {
  if (stopping_.exchange(true)) return true;
  if (monitor_.joinable()) monitor_.join();
  if (server_ == nullptr || scheduler_ == nullptr) return true;  // Start failed part way
  server_->GetHealthCheckService()->SetServingStatus(false);
  const bool drained = scheduler_->Drain(timeout);
  if (http_server_ != nullptr) http_server_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (internal_server_ != nullptr) {
    internal_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  return drained;
}

RouterServer::~RouterServer() {
  Shutdown(absl::ZeroDuration());
  scheduler_.reset();  // joins the engine thread before the backends go
}

}  // namespace strata
