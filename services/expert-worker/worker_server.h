// strata-worker: maps the expert store's shared memory, registers with the router, and runs
// the experts of every per-layer request the router sends, until stopped. Survives a router
// restart by registering again.
#ifndef STRATA_SERVICES_EXPERT_WORKER_WORKER_SERVER_H_
#define STRATA_SERVICES_EXPERT_WORKER_WORKER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/cluster/cluster_token.h"
#include "common/shm/channel.h"
#include "common/transport/cuda_ipc/worker_link.h"
#include "common/transport/mapped_experts.h"
#include "common/util/thread_pool.h"
#include "services/expert-worker/cold_path_model.h"
#include "services/expert-worker/cpu_tier_client.h"
#include "services/expert-worker/expert_tiers.h"
#include "services/expert-worker/expert_worker_service.h"
#include "services/expert-worker/worker_executor.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata {

struct WorkerOptions {
  std::string model_dir;       // for config.json; weights come from the expert store
  std::string store_address;   // strata-expert-store: unix:PATH or HOST:PORT
  std::string router_address;  // the router's internal listener: unix:PATH or HOST:PORT
  ClusterToken token;          // carried by every call to them; required of the router's
  // Names of the shared-memory channels this worker creates (its CPU tier's) start with it.
  std::string channel_prefix = "strata";
  int index = 0;
  std::string device = "cpu";           // cpu or cuda:N
  std::string expert_weights = "bf16";  // on a GPU: bf16 or fp8
  int max_tokens_per_step = 512;        // the router's step size (sizes GPU buffers)
  int num_threads = 0;
  // Bytes of expert memory (device memory on a GPU, private memory on the CPU); 0 keeps
  // every expert resident (the GPU copies them all at start, the CPU reads the store in place).
  uint64_t memory_budget = 0;
  ExpertTierOptions tiers;
  ColdPathOptions cold_path;  // misses: copied, or computed by strata-expert-store's CPU
  v1::Transport transport = v1::TRANSPORT_SHARED_MEMORY;
  std::string listen = "127.0.0.1:0";  // ExpertWorker service, for TRANSPORT_GRPC
  // Profiling: a file CUDA IPC graph steps append GPU clock stamps to (see WorkerLink).
  std::string gpu_clock_stamps;
  // Progress and waiting messages ("waiting for strata-router at ...").
  std::function<void(const std::string&)> log = [](const std::string&) {};
};

class WorkerServer {
 public:
  // Loads the config and maps the expert store (waiting for strata-expert-store as long as needed).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerOptions& options);
  ~WorkerServer();

  // Registers and serves until Stop(); registers again whenever the router goes away.
  absl::Status Run();
  void Stop() { stopping_.store(true); }

 private:
  WorkerServer() = default;
  absl::StatusOr<v1::RegisterWorkerResponse> Register();
  absl::Status CreateTiers();
  // Attaches strata-expert-store's CPU tier unless misses are always copied; logs and goes on
  // without it when the expert store cannot take it.
  void AttachCpuTier();
  // Times the CPU tier once attached and sets the cost model's CPU rates from it; an error
  // when a timing request failed (the tier is then not used).
  absl::Status CalibrateCpuTier();
  // Serves one router incarnation over a shared-memory channel; returns when it is gone.
  absl::Status ServeChannel(const std::string& name);
  // The liveness pulse (a thread): while a message is being handled, beats the channel's
  // heartbeat every 100 ms as long as the work progresses (this process uses CPU time, or the
  // CPU tier it waits on answers in slices) and for at most kMaxBusy; a worker stopped or stuck
  // in a call stops beating, and the router declares it failed.
  void Pulse();

  WorkerOptions options_;
  ModelConfig config_;
  std::unique_ptr<MappedExperts> experts_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ExpertBackend> backend_;  // without a budget
  // The experts on a GPU (backend_'s or the slots'), which CUDA IPC runs use directly; null on
  // the CPU.
  gpu::DeviceExperts* device_experts_ = nullptr;
  std::unique_ptr<WorkerLink> ipc_link_;  // while registered over CUDA IPC
  std::unique_ptr<ExpertSlots> slots_;    // with one
  std::unique_ptr<ExpertTiers> tiers_;
  std::unique_ptr<CpuTierClient> cpu_tier_;
  std::unique_ptr<CpuHostTier> cpu_host_tier_;  // the CPU tier on the CUDA IPC path, or null
  std::unique_ptr<WorkerExecutor> executor_;
  std::mutex executor_mu_;
  std::unique_ptr<ExpertWorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string service_address_;
  uint64_t incarnation_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex beat_mu_;
  ShmChannel* beating_ = nullptr;          // the channel being served, guarded by beat_mu_
  std::atomic<int64_t> busy_since_ns_{0};  // while a message is handled; 0 between messages
  std::atomic<uint64_t> progress_{0};      // work progressing outside this process
  std::thread pulse_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_WORKER_WORKER_SERVER_H_
