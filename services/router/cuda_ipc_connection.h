// One worker's TRANSPORT_CUDA_IPC connection on the router: its device buffers, flags and
// events (cuda_ipc::RouterLink), the shared-memory channel its messages go over, and what the
// router's stream waits on of it (read by the watchdog, ipc_watchdog.h).
#ifndef STRATA_SERVICES_ROUTER_CUDA_IPC_CONNECTION_H_
#define STRATA_SERVICES_ROUTER_CUDA_IPC_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "common/transport/cuda_ipc/router_link.h"
#include "common/transport/expert_connection.h"
#include "services/router/shm_expert_connection.h"

namespace strata {

class CudaIpcConnection : public ExpertConnection {
 public:
  // graph_steps: the worker can run its layers in captured decode steps (every worker holding
  // every expert can; a tiered one only when it reads cold experts in place).
  CudaIpcConnection(std::unique_ptr<ShmExpertConnection> channel,
                    std::unique_ptr<cuda_ipc::RouterLink> buffers, uint64_t generation,
                    bool graph_steps)
      : channel_(std::move(channel)),
        buffers_(std::move(buffers)),
        generation_(generation),
        graph_steps_(graph_steps) {}

  absl::Status Send(const ExpertRequestView& request) override { return channel_->Send(request); }
  absl::Status Receive(absl::FunctionRef<void(const ExpertResponseView&)> consume,
                       absl::Duration timeout) override {
    return channel_->Receive(consume, timeout);
  }
  absl::Status Prefetch(uint32_t layer, absl::Span<const int32_t> experts) override {
    return channel_->Prefetch(layer, experts);
  }
  bool Alive() const override { return channel_->Alive(); }
  absl::Status PeerStatus() const override { return channel_->PeerStatus(); }
  bool Stalled() const override { return channel_->Stalled(); }
  std::optional<Process> LocalProcess() const override { return channel_->LocalProcess(); }
  void Abandon() override { Close(); }
  // Closes the channel: the worker sees the router gone and registers again.
  void Close() { channel_->Close(); }

  cuda_ipc::RouterLink& buffers() { return *buffers_; }
  // Distinguishes this registration from earlier ones.
  uint64_t generation() const { return generation_; }
  bool graph_steps() const { return graph_steps_; }

  // The router's stream has waited on the link's output event (an eager layer).
  std::atomic<bool> awaited{false};
  // Replayed steps in flight that wait on the link's output flags.
  std::atomic<int> graph_awaited{0};
  // One replay fewer waits on the link (never below none: the watchdog may have let go of all).
  void DropGraphAwait() {
    int v = graph_awaited.load();
    while (v > 0 && !graph_awaited.compare_exchange_weak(v, v - 1)) {
    }
  }

 private:
  std::unique_ptr<ShmExpertConnection> channel_;
  std::unique_ptr<cuda_ipc::RouterLink> buffers_;
  const uint64_t generation_;
  const bool graph_steps_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_CUDA_IPC_CONNECTION_H_
