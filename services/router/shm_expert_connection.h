// An ExpertConnection over a shared-memory channel to a worker on the same host: requests
// and responses are written and read in place in the channel's ring slots.
#ifndef STRATA_SERVICES_ROUTER_SHM_EXPERT_CONNECTION_H_
#define STRATA_SERVICES_ROUTER_SHM_EXPERT_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/shm/channel.h"
#include "common/transport/expert_connection.h"

namespace strata {

// How long each side spins on the channel before sleeping: the default, and for CUDA IPC
// control messages, which follow each other every layer (tens of microseconds apart).
inline constexpr uint32_t kDefaultSpinUs = 50;
inline constexpr uint32_t kIpcSpinUs = 200;

class ShmExpertConnection : public ExpertConnection {
 public:
  // Creates the channel `name`, with slots large enough for `max_tokens` tokens per request.
  // A worker whose heartbeat stands still longer than `heartbeat_timeout` counts as gone.
  static absl::StatusOr<std::unique_ptr<ShmExpertConnection>> Create(
      const std::string& name, int max_tokens, int top_k, int hidden_size,
      uint32_t spin_us = kDefaultSpinUs,
      absl::Duration heartbeat_timeout = absl::InfiniteDuration());

  absl::Status Send(const ExpertRequestView& request) override;
  absl::Status Prefetch(uint32_t layer, absl::Span<const int32_t> experts) override;
  absl::Status Receive(absl::FunctionRef<void(const ExpertResponseView&)> consume,
                       absl::Duration timeout) override;
  bool Alive() const override;
  absl::Status PeerStatus() const override;
  bool Stalled() const override { return channel_.PeerStalled(); }
  std::optional<Process> LocalProcess() const override;
  void Abandon() override { Close(); }
  // Ends the channel: the worker's serving loop sees it closed and registers again.
  void Close() { channel_.Close(); }

 private:
  explicit ShmExpertConnection(ShmChannel channel) : channel_(std::move(channel)) {}

  mutable ShmChannel channel_;
  bool unlinked_ = false;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_SHM_EXPERT_CONNECTION_H_
