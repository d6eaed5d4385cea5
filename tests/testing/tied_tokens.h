// Greedy sequences from two GPU runs compared where bf16 rounding may flip a near tie: the two
// may part ways only where a reference cluster scores both tokens within a margin of each other
// (a wrong step picks a token far from the top).
#ifndef STRATA_TESTS_TESTING_TIED_TOKENS_H_
#define STRATA_TESTS_TESTING_TIED_TOKENS_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "strata/v1/generation.grpc.pb.h"
#include "tests/testing/cluster_process.h"
#include "tests/testing/generate_client.h"

namespace strata::testing {

// log p(token | prefix) by the cluster's Score RPC; NaN when the call fails.
inline float LastTokenLogprob(const std::string& address, std::vector<uint32_t> prefix,
                              uint32_t token) {
  prefix.push_back(token);
  v1::ScoreRequest request;
  request.mutable_token_ids()->Add(prefix.begin(), prefix.end());
  v1::ScoreResponse response;
  grpc::ClientContext context;
  const grpc::Status status = GenerationStub(address)->Score(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  if (!status.ok() || response.logprobs_size() == 0) return NAN;
  return response.logprobs(response.logprobs_size() - 1);
}

// Expects each sequence of `got` to equal `want`'s, or to part ways only where two tokens all
// but tie: a cluster started with `scorer_args` scores both after the common prefix (the
// prompt, then the tokens the two share) within `tie_nats` of each other. Returns how many
// tokens the sequences share before their first difference, summed.
inline size_t ExpectSameOrTied(const std::vector<std::string>& scorer_args,
                               const std::vector<std::vector<uint32_t>>& prompts,
                               const std::vector<std::vector<uint32_t>>& got,
                               const std::vector<std::vector<uint32_t>>& want, float tie_nats) {
  EXPECT_EQ(got.size(), prompts.size());
  EXPECT_EQ(want.size(), prompts.size());
  if (got.size() != prompts.size() || want.size() != prompts.size()) return 0;
  size_t shared = 0;
  std::unique_ptr<ClusterProcess> scorer;  // started only for a divergence
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto [g, w] = std::mismatch(got[i].begin(), got[i].end(), want[i].begin(), want[i].end());
    shared += g - got[i].begin();
    if (g == got[i].end() && w == want[i].end()) continue;
    if (g == got[i].end() || w == want[i].end()) {
      ADD_FAILURE() << "sequence " << i << ": one run's tokens are a prefix of the other's";
      continue;
    }
    if (scorer == nullptr) scorer = std::make_unique<ClusterProcess>(scorer_args);
    std::vector<uint32_t> prefix = prompts[i];
    prefix.insert(prefix.end(), got[i].begin(), g);
    const float lp_got = LastTokenLogprob(scorer->address(), prefix, *g);
    const float lp_want = LastTokenLogprob(scorer->address(), prefix, *w);
    EXPECT_LE(std::fabs(lp_got - lp_want), tie_nats)
        << "sequence " << i << " parts ways at token " << (g - got[i].begin()) << ": " << *g
        << " (logprob " << lp_got << ") against " << *w << " (logprob " << lp_want << ")";
  }
  return shared;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_TIED_TOKENS_H_
