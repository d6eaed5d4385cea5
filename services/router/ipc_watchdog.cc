#include "services/router/ipc_watchdog.h"

#include <chrono>

#include "common/cuda/cuda_status.h"
#include "common/cuda/grid_signal.h"
#include "common/cuda/stream_flags.h"
#include "common/util/process.h"

namespace strata {

absl::Status IpcWatchdog::Start() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking));
  thread_ = std::thread([this] { Watch(); });
  return absl::OkStatus();
}

IpcWatchdog::~IpcWatchdog() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  cudaSetDevice(device_);
  if (release_stream_ != nullptr) cudaStreamDestroy(release_stream_);
}

void IpcWatchdog::Watch() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stopping_; })) {
    for (const std::shared_ptr<CudaIpcConnection>& link : links_()) {
      if (link != nullptr) ReleaseIfLost(*link);
    }
  }
}

void IpcWatchdog::ReleaseIfLost(CudaIpcConnection& link) {
  std::lock_guard<std::mutex> lock(release_mu_);
  if (link.graph_awaited.load() > 0 && !link.Alive()) {
    // A replayed step waits on output flags this worker will never raise: release them all
    // for good (the split kernel's lowering leaves kFlagReleased up) and run the step again.
    // The step is marked lost before its stream can go on: FinishStep must not see it done
    // and not lost.
    lost_.store(true);
    if (gpu::FillFlags(release_stream_, link.buffers().output_flag(0), gpu::kFlagReleased,
                       static_cast<size_t>(num_layers_))
            .ok()) {
      link.graph_awaited.store(0);
      Log(LogLevel::kWarning,
          "an expert worker died during a replayed step; the step runs again without it");
    }
  }
  if (!link.awaited.load() || link.Alive()) return;
  // Gone, after the router's stream started waiting for its output event.
  const cudaError_t state = cudaEventQuery(link.buffers().output_ready());
  if (state != cudaErrorNotReady) {
    if (state != cudaSuccess) cudaGetLastError();
    link.awaited.store(false);
    return;
  }
  // Its record will never run. A record here completes at once and releases the waiting
  // stream; what that stream computed meanwhile is wrong, so the step runs again (marked
  // first, as above).
  lost_.store(true);
  cudaEventRecord(link.buffers().output_ready(), release_stream_);
  link.awaited.store(false);
  Log(LogLevel::kWarning,
      "an expert worker died with its GPU work queued; the step runs again without it");
}

}  // namespace strata
