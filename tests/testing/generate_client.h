// The cluster tests' client: streamed Generate calls over gRPC (greedy ones, in the background,
// with a hook on the first tokens to act mid-generation) and the router's counters.
#ifndef STRATA_TESTS_TESTING_GENERATE_CLIENT_H_
#define STRATA_TESTS_TESTING_GENERATE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/cluster/cluster_token.h"
#include "common/cluster/runtime_dir.h"
#include "gtest/gtest.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::testing {

struct Generated {
  grpc::Status status;
  std::vector<uint32_t> tokens;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  // The longest wait between two messages of the stream, from the first on.
  double longest_gap_ms = 0;
};

inline std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address) {
  return v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Greedy, ignoring EOS, `max_new` tokens after `prompt`.
inline v1::GenerateRequest GreedyRequest(const std::vector<uint32_t>& prompt, int max_new) {
  v1::GenerateRequest request;
  for (uint32_t id : prompt) request.add_prompt_token_ids(id);
  request.set_max_new_tokens(max_new);
  request.set_ignore_eos(true);
  return request;
}

// One streamed Generate, its tokens gathered; `on_first` runs once the first tokens arrive (to
// act mid-generation).
inline Generated Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                          const std::function<void()>& on_first = nullptr,
                          std::chrono::milliseconds deadline = std::chrono::seconds(120)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub.Generate(&context, request);
  Generated out;
  v1::GenerateResponse response;
  std::chrono::steady_clock::time_point last;
  while (reader->Read(&response)) {
    const auto now = std::chrono::steady_clock::now();
    if (!out.tokens.empty()) {
      out.longest_gap_ms = std::max(out.longest_gap_ms,
                                    std::chrono::duration<double, std::milli>(now - last).count());
    }
    last = now;
    if (out.tokens.empty() && response.token_ids_size() > 0 && on_first) on_first();
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.finish = response.finish_reason();
    }
  }
  out.status = reader->Finish();
  return out;
}

// Greedy, ignoring EOS, `max_new` tokens after `prompt`, on a channel of its own.
inline Generated GenerateGreedy(const std::string& address, const std::vector<uint32_t>& prompt,
                                int max_new, const std::function<void()>& on_first = nullptr,
                                std::chrono::milliseconds deadline = std::chrono::seconds(120)) {
  return Generate(*GenerationStub(address), GreedyRequest(prompt, max_new), on_first, deadline);
}

// Generate on a channel and a thread of its own.
inline std::future<Generated> GenerateAsync(std::string address, v1::GenerateRequest request,
                                            std::function<void()> on_first = nullptr) {
  return std::async(std::launch::async, [address = std::move(address), request = std::move(request),
                                         on_first = std::move(on_first)] {
    return Generate(*GenerationStub(address), request, on_first);
  });
}

// GenerateGreedy on a thread of its own.
inline std::future<Generated> GenerateGreedyAsync(std::string address, std::vector<uint32_t> prompt,
                                                  int max_new,
                                                  std::function<void()> on_first = nullptr) {
  return GenerateAsync(std::move(address), GreedyRequest(prompt, max_new), std::move(on_first));
}

// The moment the first tokens of any of several requests arrive: pass Callback() as their
// `on_first`, then Wait(). Must outlive the requests.
class FirstTokens {
 public:
  std::function<void()> Callback() {
    return [this] {
      if (!fired_.exchange(true)) arrived_.set_value();
    };
  }
  // False when no first token came in `timeout` (the request failed before one).
  bool Wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    return arrived_future_.wait_for(timeout) == std::future_status::ready;
  }

 private:
  std::atomic<bool> fired_{false};
  std::promise<void> arrived_;
  std::future<void> arrived_future_ = arrived_.get_future();
};

// Admin of the cluster this user's `strata up` serves at client address `address`: its router's
// internal listener and token, from the cluster's directory. Admin is not on the client port.
class AdminClient {
 public:
  explicit AdminClient(const std::string& address) {
    auto found = FindClusterByClient(address);
    EXPECT_TRUE(found.ok()) << found.status();
    if (!found.ok()) return;
    auto token = ClusterToken::FromFile(found->first.token_file());
    EXPECT_TRUE(token.ok()) << token.status();
    if (token.ok()) token_ = *std::move(token);
    stub_ = v1::Admin::NewStub(
        grpc::CreateChannel(found->second.internal, grpc::InsecureChannelCredentials()));
  }
  bool ok() const { return stub_ != nullptr; }
  v1::Admin::Stub& operator*() { return *stub_; }
  v1::Admin::Stub* operator->() { return stub_.get(); }
  // A call's context, with the cluster token.
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    token_.Attach(*context);
    return context;
  }

 private:
  std::unique_ptr<v1::Admin::Stub> stub_;
  ClusterToken token_;
};

// The router's counters (Admin.Stats); a failed call fails the test and gives empty counters.
inline v1::StatsResponse RouterStats(const std::string& address) {
  AdminClient admin(address);
  v1::StatsResponse stats;
  if (!admin.ok()) return stats;
  const grpc::Status status = admin->Stats(admin.Context().get(), v1::StatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_GENERATE_CLIENT_H_
