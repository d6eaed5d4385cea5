// The worker's end of strata-expert-store's CPU tier: a shared-memory channel this worker creates
// and strata-expert-store serves (ExpertStore.AttachCompute). A layer's cold experts go out as one
// kRun request (the slots of other experts -1, as the router sends them) with Submit; the
// worker runs its resident experts on its GPU meanwhile, then Collects the CPU's partial sums
// and adds them in.
//
//   ASSIGN_OR_RETURN(auto cpu,
//                    CpuTierClient::Connect(store_address, "strata_w3_cpu", 512, 8, 2048));
//   RETURN_IF_ERROR(cpu->Submit(cold_request));
//   ... GPU work ...
//   absl::Status s = cpu->Collect(partial, absl::Seconds(30));  // UNAVAILABLE: copy instead
#ifndef STRATA_SERVICES_EXPERT_WORKER_CPU_TIER_CLIENT_H_
#define STRATA_SERVICES_EXPERT_WORKER_CPU_TIER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backend/expert_slots.h"
#include "common/cluster/cluster_token.h"
#include "common/shm/channel.h"
#include "common/tensor/tensor.h"
#include "common/transport/expert_wire.h"

namespace strata {

class CpuTierClient {
 public:
  // Creates the channel "<channel_name_prefix>-<random>" with slots for requests of up to
  // `max_tokens` tokens and asks strata-expert-store at `store_address` to serve it (the call
  // carries `token`); returns once it does. The gRPC status of a refusal, UNAVAILABLE if the expert
  // store does not answer in time.
  static absl::StatusOr<std::unique_ptr<CpuTierClient>> Connect(
      const std::string& store_address, const std::string& channel_name_prefix, int max_tokens,
      int top_k, int hidden_size, const ClusterToken& token = ClusterToken());
  // Detaches: strata-expert-store ends its thread for this channel.
  ~CpuTierClient() = default;

  // Writes a kRun request into the channel. Waits only for a free request slot, when more
  // than two requests are outstanding (up to 10 s). INVALID_ARGUMENT for another kind or a
  // request larger than max_tokens allows; UNAVAILABLE once the expert store is gone.
  absl::Status Submit(const ExpertRequestView& request);

  // Waits up to `timeout` for the response to the oldest outstanding request and copies its
  // partial sums into `partial` ([num_tokens, hidden_size] float32). DEADLINE_EXCEEDED if it
  // is not there yet (call again: it stays outstanding); UNAVAILABLE promptly once the expert store
  // died or detached; INTERNAL with the expert store's message when it failed the request;
  // FAILED_PRECONDITION with nothing outstanding; DATA_LOSS for a corrupt response.
  absl::Status Collect(Tensor& partial, absl::Duration timeout);

  // Whether strata-expert-store's end is attached and its process runs.
  bool Alive() const;
  // Gives the channel up after a request whose answer will not be collected (a timeout, an
  // error between Submit and Collect): a late answer would be taken for the next request's.
  // Every later Submit and Collect fails with UNAVAILABLE.
  void Abandon() { abandoned_.store(true); }
  bool abandoned() const { return abandoned_.load(); }
  // Requests submitted and not collected yet.
  int outstanding() const;
  // Called every 100 ms Collect waits on a live expert store (a worker's liveness: it is waiting on
  // work that progresses elsewhere). Set before use.
  void set_on_wait(std::function<void()> on_wait) { on_wait_ = std::move(on_wait); }
  const std::string& channel_name() const { return name_; }

  // Submit and Collect may run on two different threads, but each on one at a time.

 private:
  struct Pending {
    uint64_t step;
    uint32_t layer;
    uint32_t num_tokens;
  };

  CpuTierClient(ShmChannel channel, uint32_t hidden_size)
      : channel_(std::move(channel)), name_(channel_.name()), hidden_size_(hidden_size) {}

  mutable ShmChannel channel_;  // PeerStatus is not const
  const std::string name_;
  const uint32_t hidden_size_;
  mutable std::mutex mu_;
  std::deque<Pending> pending_;  // guarded by mu_
  std::atomic<bool> abandoned_{false};
  std::function<void()> on_wait_;
};

// Seconds the CPU tier takes for `tokens` tokens of one expert: the median of requests for
// the distinct (layer, expert) pairs `experts` names, each timed the second time round (its
// pages mapped, the others read in between: name enough bytes to leave the CPU's caches). For
// the cost model's CPU figures.
absl::StatusOr<double> TimeCpuTierExpert(CpuTierClient& client,
                                         absl::Span<const std::pair<int, int>> experts, int tokens,
                                         int top_k, int hidden_size);

// The CPU tier as the expert slots' host tier: eager device runs on the CUDA IPC path send
// their CPU-tier experts through it.
class CpuHostTier : public HostExpertTier {
 public:
  // `client` must outlive this.
  CpuHostTier(CpuTierClient& client, int hidden_size) : client_(client), hidden_(hidden_size) {}
  absl::Status Submit(int layer, int64_t n, int top_k, absl::Span<const float> x,
                      absl::Span<const int32_t> ids, absl::Span<const float> weights) override;
  absl::Status Collect(Tensor& partial) override;
  void Abandon() override { client_.Abandon(); }

 private:
  CpuTierClient& client_;
  const int hidden_;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_WORKER_CPU_TIER_CLIENT_H_
