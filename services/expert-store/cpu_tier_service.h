// strata-expert-store's CPU tier: runs workers' expert requests on this process's CPUs, reading the
// weights in place from the store's shared memory, so that a worker can have a cold expert
// computed here instead of copying it to its GPU.
//
// A worker creates a ShmChannel and asks for it with ExpertStore.AttachCompute; Attach opens
// it and serves it on a thread of its own with the per-layer wire format of the router's
// channel (kRun requests in, partial sums or an error out). The thread ends when the worker
// goes away (detaches, exits or is killed) or the service is destroyed.
//
// All channels share one CpuExpertBackend and one ThreadPool, and take turns on them: each
// request already spreads every expert's matrix rows over all the pool's threads, and it is
// bound by memory bandwidth, so running two requests at once on more threads than cores
// would only make each slower. Each channel has its own executor (input and output buffers),
// so a channel encodes its response while another computes.
#ifndef STRATA_SERVICES_EXPERT_STORE_CPU_TIER_SERVICE_H_
#define STRATA_SERVICES_EXPERT_STORE_CPU_TIER_SERVICE_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/model/model_config.h"
#include "common/shm/channel.h"
#include "common/transport/mapped_experts.h"
#include "common/util/thread_pool.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

struct CpuTierOptions {
  int num_threads = 0;  // threads computing experts; <= 0: one per hardware thread
};

class CpuTierService {
 public:
  // `layout` gives the store's layout; it is called once, at the first Attach, when the
  // store's segments are mapped (and the thread pool started): a store that no worker asks
  // for CPU compute spends nothing on it.
  CpuTierService(ModelConfig config, std::function<v1::ExpertLayout()> layout,
                 CpuTierOptions options = {});
  // Stops every channel's thread and joins it (within about 200 ms plus a request in flight).
  ~CpuTierService();
  CpuTierService(const CpuTierService&) = delete;
  CpuTierService& operator=(const CpuTierService&) = delete;

  // Opens the channel `channel_name`, which the process `pid` created (0: any creator), and
  // serves it on a new thread; returns once it is open. NOT_FOUND / UNAVAILABLE if there is
  // no such channel or its creator is gone, FAILED_PRECONDITION if it already had an opener
  // or another creator, and the store's mapping errors.
  absl::Status Attach(const std::string& channel_name, pid_t pid);

  // Channels being served now (their threads have not ended).
  int active_channels();

 private:
  struct Channel;

  // Maps the store and builds the backend, once.
  absl::Status EnsureBackend();
  void Serve(ShmChannel& channel);
  // Joins the threads of channels that ended. Requires mu_.
  void ReapLocked();

  const ModelConfig config_;
  const std::function<v1::ExpertLayout()> layout_;
  const CpuTierOptions options_;

  std::mutex init_mu_;  // EnsureBackend
  std::unique_ptr<MappedExperts> experts_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuExpertBackend> backend_;
  std::mutex backend_mu_;  // one request at a time on the backend and its pool

  std::mutex mu_;
  std::list<std::unique_ptr<Channel>> channels_;
  std::atomic<bool> stopping_{false};
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_STORE_CPU_TIER_SERVICE_H_
