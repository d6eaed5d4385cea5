// The router's shared-memory connection to an expert worker: a request and its answer, and a
// channel the router closes (a worker that stopped answering a graph step), which is no longer
// alive to the router whatever the worker does.
#include "services/router/shm_expert_connection.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/shm/shm_test_util.h"
#include "tests/testing/expert_messages.h"

namespace strata {
namespace {

TEST(ShmExpertConnectionTest, RoundTripThenClose) {
  shm_test::ScopedShmName name("conn");
  auto router = ShmExpertConnection::Create(name.str(), /*max_tokens=*/4, /*top_k=*/2,
                                            /*hidden_size=*/8);
  ASSERT_TRUE(router.ok()) << router.status();
  auto worker = ShmChannel::Open(name.str());
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE((*router)->Alive());

  const std::vector<float> hidden(8, 1.0f);
  const std::vector<int32_t> experts = {0, -1};
  const std::vector<float> weights = {1.0f, 0.0f};
  const ExpertRequestView request = testing::HostRunRequest(7, 1, 8, hidden, experts, weights);
  ASSERT_TRUE((*router)->Send(request).ok());

  // The worker's side: read it, answer with a partial.
  auto bytes = worker->inbound().Peek(absl::Seconds(5));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const absl::StatusOr<ExpertRequestView> got = DecodeExpertRequest(*bytes);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<float> partial(8, 0.5f);
  std::string error;
  const ExpertResponseView response =
      ExpertResponseFor(*bytes, got, absl::OkStatus(), /*on_device=*/false, partial, error);
  auto slot = worker->outbound().Reserve(EncodedSize(response), absl::Seconds(5));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EncodeExpertResponse(response, *slot);
  ASSERT_TRUE(worker->outbound().Commit(EncodedSize(response)).ok());
  ASSERT_TRUE(worker->inbound().Pop().ok());

  uint64_t step = 0;
  std::vector<float> received;
  ASSERT_TRUE((*router)
                  ->Receive(
                      [&](const ExpertResponseView& r) {
                        step = r.step;
                        received.assign(r.partial.begin(), r.partial.end());
                      },
                      absl::Seconds(5))
                  .ok());
  EXPECT_EQ(step, 7u);
  EXPECT_EQ(received, partial);

  // Closed by the router: not alive at once (the worker is still attached), and the worker's
  // next read ends its serving loop.
  (*router)->Close();
  EXPECT_FALSE((*router)->Alive());
  EXPECT_TRUE(worker->PeerAlive());
  EXPECT_FALSE(worker->inbound().Peek(absl::Milliseconds(100)).ok());
  EXPECT_FALSE((*router)->Send(request).ok());
}

}  // namespace
}  // namespace strata
