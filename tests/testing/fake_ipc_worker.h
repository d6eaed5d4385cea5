// An expert worker's end of TRANSPORT_CUDA_IPC in the test's own process, for unit tests of the
// router's IpcExpertBackend without worker processes. It opens the router's shared-memory
// channel by name and answers on a thread of its own, as strata-worker's ServeChannel does:
// a kDeviceRun runs its layer through the worker's real WorkerLink, attached to the router's
// link buffers by address (AttachWorkerLink: a process cannot open its own CUDA IPC handles),
// on the stream of a CudaExpertBackend of its own; kPrefetch hints are kept and not answered; a
// kDeviceStep is answered as queued without running a graph (the tests launch no replay of the
// router's, whose flags a worker's graph would wait for). It keeps every request it was sent.
//
// Faults, by the request of their kind they hit (counted from 1; 0: none):
//  - vanish_on_run: takes the N-th kDeviceRun, then is gone without answering it (its end of
//    the channel detached, as a killed worker's is);
//  - hold_on_run: queues the N-th kDeviceRun behind a hold on its stream and answers it: the
//    layer's output event stays pending until Release(), as a worker's whose GPU work is stuck
//    (and, after Die(), a worker that died with the layer queued);
//  - fail_step_on: answers the N-th kDeviceStep with an error, as a worker whose graph could
//    not be launched.
// Die() makes it gone at once.
#ifndef STRATA_TESTS_TESTING_FAKE_IPC_WORKER_H_
#define STRATA_TESTS_TESTING_FAKE_IPC_WORKER_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/shm/channel.h"
#include "common/transport/cuda_ipc/link_views.h"
#include "common/transport/cuda_ipc/worker_link.h"
#include "common/transport/expert_wire.h"

namespace strata::testing {

// The faults above, by the request they hit.
struct FakeIpcWorkerFaults {
  int vanish_on_run = 0;
  int hold_on_run = 0;
  int fail_step_on = 0;
};

class FakeIpcWorker {
 public:
  using Faults = FakeIpcWorkerFaults;

  // One request as the worker decoded it.
  struct Received {
    ExpertMessageKind kind = ExpertMessageKind::kRun;
    uint64_t step = 0;
    uint32_t layer = 0;
    uint32_t num_tokens = 0;
    uint32_t top_k = 0;
    uint32_t hidden_size = 0;
    uint32_t lent_slots = 0;
    std::vector<int32_t> experts;  // a prefetch hint's
    std::vector<int32_t> layers;   // a step's
  };

  // Opens `channel` (the router's ShmExpertConnection made it) and attaches to `views` (the
  // router's link for this worker) over `experts`, which must outlive the worker.
  static absl::StatusOr<std::unique_ptr<FakeIpcWorker>> Start(const std::string& channel,
                                                              const cuda_ipc::LinkViews& views,
                                                              const ModelConfig& config,
                                                              gpu::CudaExpertBackend& experts,
                                                              int max_tokens, Faults faults = {}) {
    absl::StatusOr<ShmChannel> opened = ShmChannel::Open(channel);
    if (!opened.ok()) return opened.status();
    absl::StatusOr<std::unique_ptr<WorkerLink>> link =
        AttachWorkerLink(views, config, experts, max_tokens);
    if (!link.ok()) return link.status();
    std::unique_ptr<FakeIpcWorker> worker(new FakeIpcWorker(experts, faults));
    worker->channel_.emplace(*std::move(opened));
    worker->link_ = *std::move(link);
    worker->thread_ = std::thread([raw = worker.get()] { raw->Serve(); });
    return worker;
  }

  ~FakeIpcWorker() {
    Die();
    Release();
    // Lets whatever it queued finish before the router's buffers can go.
    if (link_ != nullptr) link_->Close().IgnoreError();
  }

  // Stops answering and detaches from the channel: the router sees the worker gone. What it
  // queued on its stream stays queued.
  void Die() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    channel_.reset();
  }

  // Lets a held run (hold_on_run) go on.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(hold_.mu);
      hold_.open = true;
    }
    hold_.cv.notify_all();
  }

  // The requests it decoded so far, in order.
  std::vector<Received> received() const {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  // Those of one kind.
  std::vector<Received> received(ExpertMessageKind kind) const {
    std::vector<Received> of_kind;
    for (const Received& r : received()) {
      if (r.kind == kind) of_kind.push_back(r);
    }
    return of_kind;
  }

 private:
  struct Hold {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };

  FakeIpcWorker(gpu::CudaExpertBackend& experts, Faults faults)
      : experts_(experts), faults_(faults) {}

  // On the CUDA runtime's callback thread: holds the stream until Release. The bound is a
  // failure guard, so that a test that fails before releasing still ends.
  static void CUDART_CB WaitForRelease(void* data) {
    Hold* hold = static_cast<Hold*>(data);
    std::unique_lock<std::mutex> lock(hold->mu);
    hold->cv.wait_for(lock, std::chrono::seconds(60), [hold] { return hold->open; });
  }

  void Record(const ExpertRequestView& r) {
    Received got;
    got.kind = r.kind;
    got.step = r.step;
    got.layer = r.layer;
    got.num_tokens = r.num_tokens;
    got.top_k = r.top_k;
    got.hidden_size = r.hidden_size;
    got.lent_slots = r.lent_slots;
    got.experts.assign(r.experts.begin(), r.experts.end());
    got.layers.assign(r.layers.begin(), r.layers.end());
    std::lock_guard<std::mutex> lock(mu_);
    received_.push_back(std::move(got));
  }

  // What the worker does with one request; nullopt: no answer (a hint, or vanishing).
  std::optional<absl::Status> Handle(const ExpertRequestView& r, bool& vanish) {
    switch (r.kind) {
      case ExpertMessageKind::kPrefetch:
        return std::nullopt;
      case ExpertMessageKind::kDeviceRun: {
        ++runs_;
        if (runs_ == faults_.vanish_on_run) {
          vanish = true;
          return std::nullopt;
        }
        if (runs_ == faults_.hold_on_run) {
          const cudaError_t held =
              cudaLaunchHostFunc(experts_.context()->stream(), WaitForRelease, &hold_);
          if (held != cudaSuccess) return absl::InternalError(cudaGetErrorString(held));
        }
        return link_->Run(r);
      }
      case ExpertMessageKind::kDeviceStep:
        ++steps_;
        if (steps_ == faults_.fail_step_on) {
          return absl::InternalError("fake IPC worker: the step's graph was not launched");
        }
        return absl::OkStatus();
      default:
        return absl::InvalidArgumentError("fake IPC worker: device requests only");
    }
  }

  void Serve() {
    cudaSetDevice(experts_.context()->device());
    std::string error;  // the text an error response points into
    while (!stop_.load()) {
      absl::StatusOr<absl::Span<const uint8_t>> bytes =
          channel_->inbound().Peek(absl::Milliseconds(20));
      if (absl::IsDeadlineExceeded(bytes.status())) continue;
      if (!bytes.ok()) break;  // the router closed the channel
      const absl::StatusOr<ExpertRequestView> request = DecodeExpertRequest(*bytes);
      std::optional<absl::Status> status = request.status();
      bool vanish = false;
      if (request.ok()) {
        Record(*request);
        status = Handle(*request, vanish);
      }
      if (vanish) break;
      if (status.has_value()) {
        const ExpertResponseView response =
            ExpertResponseFor(*bytes, request, *status, /*on_device=*/true, {}, error);
        absl::StatusOr<absl::Span<uint8_t>> slot =
            channel_->outbound().Reserve(EncodedSize(response), absl::Seconds(10));
        if (!slot.ok()) break;
        EncodeExpertResponse(response, *slot);
        if (!channel_->outbound().Commit(EncodedSize(response)).ok()) break;
      }
      if (!channel_->inbound().Pop().ok()) break;
    }
    channel_.reset();  // detached: the router sees the worker gone
  }

  gpu::CudaExpertBackend& experts_;
  const Faults faults_;
  std::optional<ShmChannel> channel_;  // the serving thread's while it runs
  std::unique_ptr<WorkerLink> link_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  Hold hold_;
  int runs_ = 0;   // serving thread
  int steps_ = 0;  // serving thread
  mutable std::mutex mu_;
  std::vector<Received> received_;  // guarded by mu_
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_FAKE_IPC_WORKER_H_
