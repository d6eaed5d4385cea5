// strata-router: loads the model's non-expert weights and tokenizer, runs the scheduler, and
// serves gRPC on two listeners: the client port (Generation, health, reflection) and the
// internal listener (Coordinator for the workers, Admin for operators; a Unix socket in the
// cluster's private directory, or TCP for workers on other hosts), where every call must carry
// the cluster token.
#ifndef STRATA_SERVICES_ROUTER_ROUTER_SERVER_H_
#define STRATA_SERVICES_ROUTER_ROUTER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster/cluster_token.h"
#include "common/engine/model_stack.h"
#include "common/engine/step_runner.h"
#include "common/grammar/grammar_compiler.h"
#include "common/placement/hot_ratio.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/admin_service.h"
#include "services/router/coordinator_service.h"
#include "services/router/draft_model.h"
#include "services/router/generation_service.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_service.h"
#include "services/router/kv_lending.h"
#include "services/router/scheduler.h"
#include "services/router/worker_expert_backend.h"

namespace strata {

struct RouterOptions {
  std::string model_dir;
  std::string listen = "127.0.0.1:0";  // the client port; port 0 picks a free port
  // Coordinator and Admin: unix:PATH, or HOST:PORT (then `token` must be set).
  std::string internal_listen;
  ClusterToken token;  // checked on every internal call; empty: none (a Unix socket only)
  // The largest gRPC message a client may send (HTTP bodies: http.max_body_bytes).
  int max_request_bytes = 8 << 20;
  int num_workers = 1;    // 0 runs the experts in this process
  std::string plan_file;  // placement from `strata plan`; empty: contiguous
  int num_threads = 0;
  // Where attention, the gate and the KV cache run: cpu, or cuda / cuda:N (then its workers
  // must be on GPUs of this host: activations move by CUDA IPC).
  std::string device = "cpu";
  // On a GPU: bf16, or fp8 (the attention projections, and the experts in this process with
  // num_workers 0).
  std::string expert_weights = "bf16";
  // The KV pool: its blocks, memory, format; requests starting with the same tokens share the
  // blocks computed for them (prefix_caching); with share_expert_memory, one memory budget for
  // the pool and the expert slots of the workers on this router's device (KvLending).
  KvCacheOptions kv;
  float gate_temperature = 1.0f;
  SchedulerOptions scheduler;
  // speculative.draft_model: drafts from this model (DraftModel) instead of prompt lookup.
  std::string draft_model_dir;
  std::string channel_prefix = "strata";
  absl::Duration expert_timeout = absl::Seconds(60);
  // A worker on this host whose heartbeat stands still this long is declared failed: its
  // experts go to the others at once, health and stats say so (strata up then restarts it).
  absl::Duration worker_liveness_timeout = absl::Milliseconds(1500);
  // ... and one of this host still stalled this long later is killed for its supervisor
  // (strata up) to restart; infinite: never.
  absl::Duration worker_kill_after = absl::Seconds(5);
  // How often an info line sums up the requests and tokens since the last (when there were any).
  absl::Duration throughput_log_interval = absl::Seconds(10);
  // The workers' hot ratio: a fixed value in [0, 1], or negative for the policy by context.
  float hot_ratio = -1.0f;
  HotRatioPolicy hot_ratio_policy;
  bool prefetch = true;  // predict the next layer's experts and tell the workers
  // With prefetch: hint MoE layers up to this many layers ahead too, and send the GPU's
  // predictions of eager steps (ForwardOptions::prefetch_lookahead); 0: the next layer only.
  int prefetch_lookahead = 0;
  // gRPC-transport workers: hidden states and partial sums cross as FP8 E4M3 with a scale per
  // token (a quarter of the bytes) instead of float32.
  bool fp8_activations = false;
  // On a GPU: decode-only steps of up to this many sequences replay a CUDA graph (one per
  // batch size); 0 turns graphs off.
  int cuda_graph_max_batch = 32;
  // Profiling: a file the GPU cluster's replayed steps append GPU clock stamps to (see
  // gpu::ClockStamps); empty: none.
  std::string gpu_clock_stamps;
  // The OpenAI-compatible HTTP API and /metrics on this port of the `listen` host: -1 is off,
  // 0 picks a free port. `http.host` and `http.port` are set from these.
  int http_port = -1;
  HttpServerOptions http;
  // The model's id in the HTTP API (/v1/models, the `model` requests name); empty: the last
  // component of model_dir.
  std::string served_model_name;
  // The HTTP API's key (IsApiKey), asked of /v1/* and the tokenizer's routes; empty: none.
  std::string api_key;
  // How the HTTP API reads the model's tool calls (ChooseToolCallFormat's names).
  std::string tool_call_parser = "auto";
};

class RouterServer {
 public:
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterOptions& options);
  ~RouterServer();

  // host:port of the client port.
  const std::string& address() const { return address_; }
  // The internal listener's address (unix:PATH or host:port).
  const std::string& internal_address() const { return internal_address_; }
  // The HTTP API's port, 0 when it is off.
  int http_port() const { return http_server_ != nullptr ? http_server_->port() : 0; }
  // True once every configured worker is connected (health is SERVING then).
  bool ready() const { return ready_.load(); }
  // Blocks until ready() or the timeout; false on timeout.
  bool WaitReady(absl::Duration timeout);
  // Stops admitting, drains in-flight requests up to `timeout`, shuts the server down. True
  // when every request finished.
  bool Shutdown(absl::Duration timeout);

  Scheduler& scheduler() { return *scheduler_; }

 private:
  RouterServer() = default;
  void MonitorWorkers();
  // Logs what was done since `reported` and `reported_uses` (over `span`), when anything was;
  // updates both.
  void ReportThroughput(absl::Duration span, RequestMetrics::Totals& reported,
                        ExpertUses& reported_uses);
  // The tiered workers' expert uses since they started, summed (zero without tiers).
  ExpertUses WorkerExpertUses() const;
  absl::Status StartHttp();
  // Once a step (engine thread): what the workers on this device lend to the KV pool for the
  // hot ratio `ratio`, and the pool's resize when their memory came or must go back.
  void LendKvMemory(float ratio);
  RouterSnapshot Snapshot() const;

  // Builds worker_experts_ (num_workers > 0) for the placement, on the stack's device.
  absl::Status CreateWorkerExperts(PlacementPlan placement, CoordinatorOptions& coordinator);

  RouterOptions options_;
  std::unique_ptr<ModelStack> stack_;  // model, router backend, KV cache; local experts
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GrammarCompiler> grammar_;  // response formats (refuses all without a tokenizer)
  std::unique_ptr<WorkerExpertBackend> worker_experts_;  // num_workers > 0
  std::unique_ptr<HotRatioControl> hot_ratio_;
  std::unique_ptr<KvLending> lending_;  // kv_share_expert_memory
  std::vector<int> owned_experts_;      // (layer, expert) pairs, by worker
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<GenerationService> generation_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<grpc::Server> server_;           // the client port
  std::unique_ptr<grpc::Server> internal_server_;  // Coordinator, Admin
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<HttpServer> http_server_;
  std::string address_;
  std::string internal_address_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::thread monitor_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_ROUTER_SERVER_H_
