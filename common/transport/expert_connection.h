// The router's end of one worker's per-layer exchange. Implementations: a shared-memory
// channel (same host) and a gRPC stream (any host).
#ifndef STRATA_COMMON_TRANSPORT_EXPERT_CONNECTION_H_
#define STRATA_COMMON_TRANSPORT_EXPERT_CONNECTION_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport/expert_wire.h"

namespace strata {

// Bytes of per-layer messages a transport that serializes them (gRPC) sent and received, over
// all its connections: the messages' payload, without the framing of the layers below.
struct WireBytes {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
};

class ExpertConnection {
 public:
  virtual ~ExpertConnection() = default;
  // Hands one layer's request to the worker; returns once it is on its way.
  virtual absl::Status Send(const ExpertRequestView& request) = 0;
  // Waits for the response to the oldest request sent and not yet received, and passes it to
  // `consume` (the view is valid only during the call). UNAVAILABLE when the worker is gone.
  virtual absl::Status Receive(absl::FunctionRef<void(const ExpertResponseView&)> consume,
                               absl::Duration timeout) = 0;
  // Tells the worker which experts of `layer` the router predicts, so that it starts loading
  // them; nothing comes back. Transports without a cheap one-way message ignore it.
  virtual absl::Status Prefetch(uint32_t layer, absl::Span<const int32_t> experts) {
    return absl::OkStatus();
  }
  // False once the worker is known to be gone.
  virtual bool Alive() const = 0;
  // Why the worker is gone (OK while Alive()).
  virtual absl::Status PeerStatus() const {
    return Alive() ? absl::OkStatus() : absl::UnavailableError("the expert worker is gone");
  }
  // Whether the worker was found stopped answering while its process still ran (a stopped,
  // stuck or swapped-out worker), rather than exited.
  virtual bool Stalled() const { return false; }
  // Stops using the connection for good (a worker declared failed): the worker sees it end
  // and registers again with a new one, never picking up this one where it stopped.
  virtual void Abandon() {}
  // The worker's process on this host (pid, start time), when the transport knows it: what
  // the router may kill when the worker stopped answering. Nullopt for remote transports.
  struct Process {
    pid_t pid = 0;
    uint64_t start_time = 0;
  };
  virtual std::optional<Process> LocalProcess() const { return std::nullopt; }
};

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_EXPERT_CONNECTION_H_
