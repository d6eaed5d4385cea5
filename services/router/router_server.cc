#include "services/router/router_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/placement/plan_file.h"
#include "common/util/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options) {
  std::unique_ptr<RouterServer> s(new RouterServer());
  s->options_ = options;
  ASSIGN_OR_RETURN(s->model_, LoadModel(options.model_dir));
  const ModelConfig& c = s->model_->config;
  const std::string tokenizer_path =
      (std::filesystem::path(options.model_dir) / "tokenizer.json").string();
  std::error_code ec;
  if (std::filesystem::exists(tokenizer_path, ec)) {
    ASSIGN_OR_RETURN(s->tokenizer_, Tokenizer::FromFile(tokenizer_path));
  }

  KvCacheOptions kv;
  kv.block_size = options.kv_block_size;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  if (kv.block_size <= 0) return absl::InvalidArgumentError("kv_cache.block_size must be positive");
  kv.num_blocks = static_cast<int>(options.kv_cache_bytes / KvBlockBytes(kv));
  if (kv.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the KV-cache budget of ",
                                                   options.kv_cache_bytes,
                                                   " bytes holds no block of ", KvBlockBytes(kv)));
  }
  ASSIGN_OR_RETURN(PagedKvCache cache, PagedKvCache::Create(kv));
  s->kv_ = std::make_unique<PagedKvCache>(std::move(cache));

  s->pool_ = std::make_unique<ThreadPool>(options.num_threads);
  s->router_backend_ = std::make_unique<CpuRouterBackend>(*s->model_, *s->pool_);
  ExpertCounts calibration;
  if (options.num_workers > 0) {
    PlacementPlan placement =
        PlacementPlan::Contiguous(c.num_layers, c.num_experts, options.num_workers);
    if (!options.plan_file.empty()) {
      ASSIGN_OR_RETURN(PlanFile plan, LoadPlan(options.plan_file, c.num_layers, c.num_experts,
                                               options.num_workers));
      placement = std::move(plan.plan);
      calibration = std::move(plan.counts);
    }
    auto remote = std::make_unique<RemoteExpertBackend>(
        c, std::move(placement), RemoteExpertOptions{.timeout = options.expert_timeout});
    s->remote_ = remote.get();
    s->expert_backend_ = std::move(remote);
    s->hot_ratio_ = std::make_unique<HotRatioControl>(options.hot_ratio_policy);
    if (options.hot_ratio >= 0.0f) RETURN_IF_ERROR(s->hot_ratio_->SetFixed(options.hot_ratio));
    s->remote_->set_hot_ratio(s->hot_ratio_->Update(0));
  } else {
    s->local_experts_source_ = std::make_unique<ModelExpertSource>(s->model_->weights);
    s->expert_backend_ =
        std::make_unique<CpuExpertBackend>(c, *s->local_experts_source_, *s->pool_);
  }
  ForwardOptions forward_options;
  forward_options.router_temperature = options.router_temperature;
  if (s->remote_ != nullptr) {
    forward_options.predict_next_experts = options.prefetch;
    forward_options.on_batch = [remote = s->remote_,
                                control = s->hot_ratio_.get()](const BatchLayout& batch) {
      int64_t longest = 0;
      for (int64_t p : batch.position) longest = std::max(longest, p + 1);
      remote->set_hot_ratio(control->Update(longest));
    };
  }
  s->forward_ =
      std::make_unique<ForwardPass>(c, *s->router_backend_, *s->expert_backend_, forward_options);
  s->scheduler_ =
      std::make_unique<Scheduler>(c, *s->forward_, *s->kv_, s->tokenizer_.get(), options.scheduler);
  s->generation_ = std::make_unique<GenerationService>(c, *s->scheduler_, s->tokenizer_.get(),
                                                       options.num_workers);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s->generation_.get());
  s->admin_ = std::make_unique<AdminService>(*s->scheduler_, *s->kv_, *s->forward_, s->remote_,
                                             s->hot_ratio_.get());
  builder.RegisterService(s->admin_.get());
  if (s->remote_ != nullptr) {
    s->coordinator_ = std::make_unique<CoordinatorService>(
        c, *s->remote_,
        CoordinatorOptions{.channel_prefix = options.channel_prefix,
                           .max_tokens_per_step = options.scheduler.max_batch_tokens,
                           .calibration = std::move(calibration)});
    builder.RegisterService(s->coordinator_.get());
  }
  builder.SetMaxReceiveMessageSize(64 << 20);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  s->address_ = absl::StrCat(host, ":", port);
  // The whole server ("") and the Generation service by name: NOT_SERVING until every worker
  // has registered.
  s->server_->GetHealthCheckService()->SetServingStatus("strata.v1.Generation", false);
  s->server_->GetHealthCheckService()->SetServingStatus(false);
  s->scheduler_->Start();
  s->monitor_ = std::thread([raw = s.get()] { raw->MonitorWorkers(); });
  return s;
}

void RouterServer::MonitorWorkers() {
  while (!stopping_.load()) {
    const bool all = remote_ == nullptr || remote_->num_connected() == remote_->num_workers();
    if (all != ready_.load()) {
      ready_.store(all);
      server_->GetHealthCheckService()->SetServingStatus(all);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return drained;
}

RouterServer::~RouterServer() {
  Shutdown(absl::ZeroDuration());
  scheduler_.reset();  // joins the engine thread before the backends go
}

}  // namespace strata
