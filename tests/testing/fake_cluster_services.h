// strata-expert-store's ExpertStore and strata-router's Coordinator as gRPC services in the
// test's own process, for unit tests of strata-worker (WorkerServer) without those processes.
// Both listen on a Unix socket and check the cluster token as the real services do.
//  - FakeExpertStore hands out a fixed layout (ExpertStore::MapInPlace of a checkpoint
//    makes a real one without shared memory).
//  - FakeCoordinator answers every registration with the experts, calibration and hot ratio
//    it was given and, for the shared-memory transport, a channel of its own that the test
//    then drives as the router does; destroying it is the router going away. It can also
//    refuse every registration with a given status.
#ifndef STRATA_TESTS_TESTING_FAKE_CLUSTER_SERVICES_H_
#define STRATA_TESTS_TESTING_FAKE_CLUSTER_SERVICES_H_

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cluster/cluster_token.h"
#include "common/model/model_config.h"
#include "common/shm/channel.h"
#include "common/transport/expert_wire.h"
#include "common/util/grpc_listen.h"
#include "common/util/grpc_status.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata::testing {

// Starts `server` serving `service` at `address`.
inline absl::Status Serve(grpc::Service* service, const std::string& address,
                          std::unique_ptr<grpc::Server>& server) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  absl::StatusOr<ListeningServer> listening = StartListening(builder, address);
  if (!listening.ok()) return listening.status();
  server = std::move(listening->server);
  return absl::OkStatus();
}

class FakeExpertStore final : public v1::ExpertStore::CallbackService {
 public:
  FakeExpertStore(v1::ExpertLayout layout, ClusterToken token)
      : layout_(std::move(layout)), token_(std::move(token)) {}
  ~FakeExpertStore() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Serves at `address` (unix:PATH).
  absl::Status Start(const std::string& address) { return Serve(this, address, server_); }
  int calls() const { return calls_.load(); }

  grpc::ServerUnaryReactor* GetLayout(grpc::CallbackServerContext* context,
                                      const v1::GetLayoutRequest*,
                                      v1::ExpertLayout* response) override {
    calls_.fetch_add(1);
    const absl::Status allowed = token_.Check(*context);
    if (allowed.ok()) *response = layout_;
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }

 private:
  const v1::ExpertLayout layout_;
  const ClusterToken token_;
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
};

class FakeCoordinator final : public v1::Coordinator::CallbackService {
 public:
  // One registration it accepted: what the worker sent, and the channel made for it (null for
  // TRANSPORT_GRPC, or once closed).
  struct Registration {
    v1::RegisterWorkerRequest request;
    std::unique_ptr<ShmChannel> channel;
  };

  // `answer` is copied into every accepted registration's response; the channels hold
  // requests of up to `max_tokens` tokens of `config`.
  FakeCoordinator(const ModelConfig& config, int max_tokens, ClusterToken token,
                  v1::RegisterWorkerResponse answer)
      : slot_bytes_(ExpertSlotBytes(max_tokens, config.top_k, config.hidden_size)),
        token_(std::move(token)),
        answer_(std::move(answer)) {}
  // Stops serving and closes every channel, as a router that went away.
  ~FakeCoordinator() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  absl::Status Start(const std::string& address) { return Serve(this, address, server_); }

  // Every registration from now on is answered with `status` (not OK).
  void Refuse(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = std::move(status);
  }
  int refused() const { return refused_.load(); }

  // The `n`-th accepted registration (from 1), once it came; null if it did not within
  // `timeout`.
  Registration* WaitForRegistration(int n, absl::Duration timeout = absl::Seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool came = changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
      return static_cast<int>(registrations_.size()) >= n;
    });
    return came ? &registrations_[n - 1] : nullptr;
  }

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(Register(token_.Check(*context), *request, *response)));
    return reactor;
  }

 private:
  absl::Status Register(absl::Status allowed, const v1::RegisterWorkerRequest& request,
                        v1::RegisterWorkerResponse& response) {
    std::lock_guard<std::mutex> lock(mu_);
    if (allowed.ok()) allowed = refusal_;
    if (!allowed.ok()) {
      refused_.fetch_add(1);
      return allowed;
    }
    Registration registration;
    registration.request = request;
    response = answer_;
    response.set_transport(request.transport());
    if (request.transport() == v1::TRANSPORT_SHARED_MEMORY) {
      // Unique to this process: test binaries run in parallel.
      const std::string name =
          absl::StrCat("strata-fake-coord-", ::getpid(), "-", next_channel_.fetch_add(1));
      absl::StatusOr<ShmChannel> channel =
          ShmChannel::Create(name, {.slots = 4, .slot_bytes = slot_bytes_});
      if (!channel.ok()) return channel.status();
      registration.channel = std::make_unique<ShmChannel>(*std::move(channel));
      response.set_channel_name(name);
    }
    registrations_.push_back(std::move(registration));
    changed_.notify_all();
    return absl::OkStatus();
  }

  static inline std::atomic<int> next_channel_{0};
  const uint64_t slot_bytes_;
  const ClusterToken token_;
  const v1::RegisterWorkerResponse answer_;
  std::mutex mu_;
  std::condition_variable changed_;
  absl::Status refusal_;                    // guarded by mu_
  std::deque<Registration> registrations_;  // guarded by mu_; a deque: pointers stay valid
  std::atomic<int> refused_{0};
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_FAKE_CLUSTER_SERVICES_H_
