// The CUDA IPC experts' watchdog: a worker that dies after answering leaves the router's
// stream waiting for an output event whose record will never run, or for output flags of a
// replayed step it will never raise. A thread checks the connections every 20 ms; for a dead
// worker that the stream waits on it records the event itself or releases the flags for good
// (kFlagReleased), so the stream goes on, and marks the step lost: it runs again without that
// worker (IpcExpertBackend::FinishStep).
#ifndef STRATA_SERVICES_ROUTER_IPC_WATCHDOG_H_
#define STRATA_SERVICES_ROUTER_IPC_WATCHDOG_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "services/router/cuda_ipc_connection.h"

namespace strata {

class IpcWatchdog {
 public:
  using LinkList = std::function<std::vector<std::shared_ptr<CudaIpcConnection>>()>;

  // `links` lists the links to watch, null for workers without one (called from the
  // watchdog's thread); `num_layers` is the flags' layout.
  IpcWatchdog(int device, int num_layers, LinkList links)
      : device_(device), num_layers_(num_layers), links_(std::move(links)) {}
  ~IpcWatchdog();

  // Creates the release stream and starts the thread.
  absl::Status Start();

  // Releases what the router's stream waits on of `link` when its worker is gone, marking the
  // step lost. Any thread.
  void ReleaseIfLost(CudaIpcConnection& link);
  // Whether a step was marked lost since the last call; clears the mark.
  bool TakeLost() { return lost_.exchange(false); }

  // A stream of the router's device for releases, resets and set-ups that must not queue behind
  // the engine's stream.
  cudaStream_t release_stream() const { return release_stream_; }

 private:
  void Watch();

  const int device_;
  const int num_layers_;
  LinkList links_;
  cudaStream_t release_stream_ = nullptr;
  std::atomic<bool> lost_{false};
  std::mutex release_mu_;  // ReleaseIfLost: the watchdog and registrations
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;  // guarded by watch_mu_
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_IPC_WATCHDOG_H_
