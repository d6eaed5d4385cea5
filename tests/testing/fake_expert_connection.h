// An expert worker in the test's own process, for unit tests of the router's expert backend
// (WorkerExpertBackend) without worker processes, shared memory or GPUs. It answers each
// request as strata-worker does: the request and the response go through the wire encoding
// (expert_wire.h), and the request's experts run on a CpuExpertBackend over the same model
// (ExpertExecutor). It works out the answer when a request is sent and hands answers out in
// order, one per Receive.
//
// It can be told to fail as a real worker does, on the N-th run request it is sent (counted
// from 1):
//  - fail_send_on: Send fails (UNAVAILABLE) and the worker is gone, like a channel whose
//    worker died before the request could go out;
//  - vanish_on: Send takes the request, then the worker is gone without answering it: Alive()
//    turns false and Receive reports UNAVAILABLE, like a worker killed mid-layer;
//  - late_on: the answer comes late: the Receive waiting for it waits out its timeout and
//    fails, and the answer is delivered by the next Receive (a slow worker, still alive).
// Kill() makes it gone at once. One caller at a time, as with the real connections, except
// Alive(), which any thread may call.
#ifndef STRATA_TESTS_TESTING_FAKE_EXPERT_CONNECTION_H_
#define STRATA_TESTS_TESTING_FAKE_EXPERT_CONNECTION_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/transport/expert_connection.h"
#include "common/transport/expert_executor.h"

namespace strata::testing {

class FakeExpertConnection : public ExpertConnection {
 public:
  // `config`, `experts` and `pool` must outlive the connection.
  FakeExpertConnection(const ModelConfig& config, const ExpertWeightSource& experts,
                       ThreadPool& pool)
      : backend_(config, experts, pool), executor_(config, backend_) {}

  // Faults, by the run request they hit (counted from 1); 0: none.
  int fail_send_on = 0;
  int vanish_on = 0;
  int late_on = 0;

  // What the worker was asked to do: one entry per request it accepted.
  struct Accepted {
    uint64_t step;
    uint32_t layer;
    std::vector<int32_t> experts;  // the distinct expert ids it was asked to run, ascending
  };
  const std::vector<Accepted>& accepted() const { return accepted_; }
  // Requests accepted and not yet received (answered or not).
  int outstanding() const { return static_cast<int>(queue_.size()); }
  // Answers received while a later request was already waiting behind them: the caller did not
  // collect them in their own exchange (it skipped them later, or never asked).
  int received_behind() const { return received_behind_; }
  // The first misuse of the connection seen (a Receive with nothing sent), or empty.
  const std::string& violation() const { return violation_; }

  void Kill() { alive_.store(false); }
  bool Alive() const override { return alive_.load(); }

  absl::Status Send(const ExpertRequestView& request) override {
    if (!alive_.load()) return absl::UnavailableError("fake expert worker is gone");
    const int n = ++sends_;
    if (n == fail_send_on) {
      Kill();
      return absl::UnavailableError(absl::StrCat("fake expert worker died at request ", n));
    }
    std::vector<uint8_t> request_bytes(EncodedSize(request));
    EncodeExpertRequest(request, absl::MakeSpan(request_bytes));
    // The worker's side, as in WorkerServer::ServeChannel.
    const absl::StatusOr<ExpertRequestView> decoded = DecodeExpertRequest(request_bytes);
    absl::Status status = decoded.status();
    if (status.ok() && decoded->kind != ExpertMessageKind::kRun) {
      status = absl::InvalidArgumentError("fake expert worker: only host run requests");
    }
    if (status.ok()) {
      accepted_.push_back({decoded->step, decoded->layer, DistinctExperts(decoded->experts)});
      tiers_.hot_hits += accepted_.back().experts.size();
      status = executor_.Run(*decoded);
    }
    const Tensor& partial = executor_.partial();
    std::string error;
    ExpertResponseView response =
        ExpertResponseFor(request_bytes, decoded, status, /*on_device=*/false,
                          absl::Span<const float>(partial.data(), partial.size()), error);
    response.tiers = tiers_;
    Pending pending;
    pending.late = n == late_on;
    pending.answered = n != vanish_on;
    pending.response.resize(EncodedSize(response));
    EncodeExpertResponse(response, absl::MakeSpan(pending.response));
    queue_.push_back(std::move(pending));
    if (n == vanish_on) Kill();  // after taking the request, before answering it
    return absl::OkStatus();
  }

  absl::Status Receive(absl::FunctionRef<void(const ExpertResponseView&)> consume,
                       absl::Duration timeout) override {
    if (queue_.empty() || !queue_.front().answered) {
      if (!alive_.load()) return absl::UnavailableError("fake expert worker is gone");
      if (violation_.empty()) violation_ = "Receive with no request outstanding";
      return absl::FailedPreconditionError(violation_);
    }
    Pending& front = queue_.front();
    if (front.late) {
      front.late = false;  // it arrives just after this Receive gives up
      absl::SleepFor(timeout);
      return absl::UnavailableError("fake expert worker: deadline exceeded waiting for a message");
    }
    const absl::StatusOr<ExpertResponseView> response = DecodeExpertResponse(front.response);
    if (!response.ok()) return response.status();
    if (queue_.size() > 1) ++received_behind_;
    consume(*response);
    queue_.pop_front();
    return absl::OkStatus();
  }

 private:
  struct Pending {
    std::vector<uint8_t> response;  // encoded
    bool answered = true;           // false: the worker vanished before answering
    bool late = false;
  };

  static std::vector<int32_t> DistinctExperts(absl::Span<const int32_t> slots) {
    std::vector<int32_t> experts;
    for (int32_t e : slots) {
      if (e >= 0) experts.push_back(e);
    }
    std::sort(experts.begin(), experts.end());
    experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
    return experts;
  }

  CpuExpertBackend backend_;
  ExpertExecutor executor_;
  std::atomic<bool> alive_{true};
  int sends_ = 0;  // run requests Send was called with while alive
  int received_behind_ = 0;
  std::deque<Pending> queue_;
  std::vector<Accepted> accepted_;
  TierCounters tiers_;
  std::string violation_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_FAKE_EXPERT_CONNECTION_H_
