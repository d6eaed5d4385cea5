// The cluster tests' client: one streamed greedy Generate over gRPC, the router's counters,
// and where the oracle models are.
#ifndef STRATA_TESTS_TESTING_GENERATE_CLIENT_H_
#define STRATA_TESTS_TESTING_GENERATE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::testing {

inline std::string OracleDir(const std::string& name) {
  return std::string(STRATA_TEST_DATA_DIR) + "/oracles/" + name;
}

struct Generated {
  grpc::Status status;
  std::vector<uint32_t> tokens;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

// Greedy, ignoring EOS, `max_new` tokens after `prompt`; `on_first` runs once the first tokens
// arrive (to act mid-generation).
inline Generated GenerateGreedy(const std::string& address, const std::vector<uint32_t>& prompt,
                                int max_new, std::function<void()> on_first = nullptr,
                                int deadline_s = 120) {
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  for (uint32_t id : prompt) request.add_prompt_token_ids(id);
  request.set_max_new_tokens(max_new);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
  auto reader = stub->Generate(&context, request);
  Generated out;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (out.tokens.empty() && response.token_ids_size() > 0 && on_first) on_first();
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.finish = response.finish_reason();
    }
  }
  out.status = reader->Finish();
  return out;
}

// The router's counters (Admin.Stats); a failed call fails the test and gives empty counters.
inline v1::StatsResponse RouterStats(const std::string& address) {
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::StatsResponse stats;
  const grpc::Status status = stub->Stats(&context, v1::StatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_GENERATE_CLIENT_H_
