// IpcExpertBackend's eager layers against workers' ends in this process
// (tests/testing/fake_ipc_worker.h): what each worker is sent, the partials summed against the
// same experts run directly, a worker gone before answering (its layer runs again on the
// others) or dying with its layer queued (the watchdog releases the router's stream and the
// step is lost), prefetch hints, and what does not fit the buffers. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "tests/services/router/ipc_expert_fixture.h"

namespace strata::ipc_test {
namespace {

using Received = ::strata::testing::FakeIpcWorker::Received;

// The largest difference between `got` and `want` (bf16), relative to want's largest value.
float RelativeError(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  float scale = 0.0f, worst = 0.0f;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    scale = std::max(scale, std::abs(Bf16ToFloat(want[i])));
    worst = std::max(worst, std::abs(Bf16ToFloat(got[i]) - Bf16ToFloat(want[i])));
  }
  return got.size() == want.size() && scale > 0.0f ? worst / scale : INFINITY;
}

using IpcExpertBackendTest = IpcExpertTest;

TEST_F(IpcExpertBackendTest, OneWorkerRunsEachLayerAsTheExpertsDoDirectly) {
  MakeBackend(1);
  Connect(0);
  for (int layer = 0; layer < config().num_layers; ++layer) {
    const LayerInput in = Input(1 + 3 * layer, 10 + layer);
    auto out = Run(layer, in);
    ASSERT_TRUE(out.ok()) << out.status();
    // The same kernels on the same inputs: the same bits.
    EXPECT_EQ(*out, Direct(layer, in)) << "layer " << layer;
    EXPECT_TRUE(backend_->FinishStep().ok());
  }
  const std::vector<Received> runs = workers_[0]->received(ExpertMessageKind::kDeviceRun);
  ASSERT_EQ(runs.size(), 3u);
  for (int layer = 0; layer < 3; ++layer) {
    EXPECT_EQ(runs[layer].layer, static_cast<uint32_t>(layer));
    EXPECT_EQ(runs[layer].num_tokens, static_cast<uint32_t>(1 + 3 * layer));
    EXPECT_EQ(runs[layer].top_k, 2u);
    EXPECT_EQ(runs[layer].hidden_size, static_cast<uint32_t>(config().hidden_size));
    if (layer > 0) {
      EXPECT_GT(runs[layer].step, runs[layer - 1].step);
    }
  }
  EXPECT_EQ(backend_->reroutes(), 0);
}

TEST_F(IpcExpertBackendTest, TwoWorkersRunTheirOwnExpertsAndThePartialsAreSummed) {
  MakeBackend(2);
  Connect(0);
  Connect(1);
  backend_->set_lent_slots(1, 3);
  const int layer = 1;
  const LayerInput in = Input(5, 7);
  auto out = Run(layer, in);
  ASSERT_TRUE(out.ok()) << out.status();
  // Each worker was handed only its own experts' slots.
  const std::vector<uint16_t> p0 = Partial(0, in.n), p1 = Partial(1, in.n);
  EXPECT_EQ(p0, Direct(layer, in, 0));
  EXPECT_EQ(p1, Direct(layer, in, 1));
  // Summed in float and rounded once.
  std::vector<uint16_t> sum(p0.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    sum[i] = FloatToBf16(Bf16ToFloat(p0[i]) + Bf16ToFloat(p1[i]));
  }
  EXPECT_EQ(*out, sum);
  // Within the partials' rounding of the experts run together.
  EXPECT_LT(RelativeError(*out, Direct(layer, in)), 1.0f / 64);
  // Every request carries the slots its worker is asked to lend.
  const std::vector<Received> runs0 = workers_[0]->received(ExpertMessageKind::kDeviceRun);
  const std::vector<Received> runs1 = workers_[1]->received(ExpertMessageKind::kDeviceRun);
  ASSERT_EQ(runs0.size(), 1u);
  ASSERT_EQ(runs1.size(), 1u);
  EXPECT_EQ(runs0[0].lent_slots, 0u);
  EXPECT_EQ(runs1[0].lent_slots, 3u);
  EXPECT_EQ(runs0[0].step, runs1[0].step);
  EXPECT_TRUE(backend_->FinishStep().ok());
}

TEST_F(IpcExpertBackendTest, AWorkerGoneBeforeAnsweringHasItsLayerRunAgainOnTheOthers) {
  MakeBackend(2);
  Connect(0);
  Connect(1, {.vanish_on_run = 1});
  const LayerInput in = Input(4, 3);
  auto out = Run(0, in);
  ASSERT_TRUE(out.ok()) << out.status();
  // The rerun's only partial is worker 0's, with every expert.
  EXPECT_EQ(*out, Direct(0, in));
  EXPECT_EQ(backend_->reroutes(), 1);
  EXPECT_FALSE(backend_->connected(1));
  ASSERT_TRUE(backend_->failure(1).has_value());
  EXPECT_FALSE(backend_->failure(1)->reason.empty());
  EXPECT_EQ(workers_[0]->received(ExpertMessageKind::kDeviceRun).size(), 2u);
  EXPECT_TRUE(backend_->FinishStep().ok());

  // The next layer goes to worker 0 alone from the start.
  const LayerInput next = Input(3, 4);
  out = Run(1, next);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, Direct(1, next));
  EXPECT_EQ(backend_->reroutes(), 1);
  EXPECT_EQ(workers_[1]->received(ExpertMessageKind::kDeviceRun).size(), 1u);
}

TEST_F(IpcExpertBackendTest, AWorkerThatDiesWithItsLayerQueuedIsReleasedByTheWatchdog) {
  MakeBackend(2);
  Connect(0);
  Connect(1, {.hold_on_run = 1});
  const LayerInput in = Input(2, 5);
  Tensor out;
  // Both answered; worker 1's output event is still to come.
  ASSERT_TRUE(backend_->RunExperts(0, in.tensor, in.routing, out).ok());
  EXPECT_EQ(cudaStreamQuery(router_stream()), cudaErrorNotReady);
  // Gone with its record queued: the watchdog records the event itself and the stream goes on.
  workers_[1]->Die();
  EXPECT_TRUE(WaitForStream(router_stream())) << "the router's stream was not released";
  const absl::Status finished = backend_->FinishStep();
  EXPECT_TRUE(absl::IsAborted(finished)) << finished;
  EXPECT_TRUE(absl::StrContains(finished.message(), "died")) << finished;
  EXPECT_TRUE(backend_->FinishStep().ok()) << "the lost step is reported once";
  workers_[1]->Release();

  // The step runs again without it.
  auto again = Run(0, in);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, Direct(0, in));
  EXPECT_FALSE(backend_->connected(1));
  EXPECT_TRUE(backend_->FinishStep().ok());
}

TEST_F(IpcExpertBackendTest, PrefetchHintsGoToTheWorkersThatTakeThem) {
  MakeBackend(2);
  Connect(0, {}, /*graph_steps=*/true, /*wants_prefetch=*/true);
  Connect(1);
  EXPECT_TRUE(backend_->wants_prefetch());
  RoutingTable predicted;
  predicted.Resize(3, 2);
  predicted.expert = {1, 5, 2, 1, 6, 2};
  const int layer = 2;
  backend_->Prefetch(layer, predicted);
  // The channel keeps the order: once the layer is answered the hint has been read.
  ASSERT_TRUE(Run(layer, Input(2, 9)).ok());
  const std::vector<Received> got = workers_[0]->received();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, ExpertMessageKind::kPrefetch);
  EXPECT_EQ(got[0].layer, static_cast<uint32_t>(layer));
  // Its own experts (0-3) only, each once, in the order predicted.
  EXPECT_EQ(got[0].experts, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(got[1].kind, ExpertMessageKind::kDeviceRun);
  // A worker that takes no hints gets none.
  EXPECT_TRUE(workers_[1]->received(ExpertMessageKind::kPrefetch).empty());
}

TEST_F(IpcExpertBackendTest, RefusesWhatDoesNotFitItsBuffers) {
  const PlacementPlan one = PlacementPlan::Contiguous(config().num_layers, config().num_experts, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      IpcExpertBackend::Create(config(), one, {}, router_context_.get(), 0).status()));
  const PlacementPlan many = PlacementPlan::Contiguous(config().num_layers, config().num_experts,
                                                       gpu::kMaxSplitTargets + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      IpcExpertBackend::Create(config(), many, {}, router_context_.get(), kMaxTokens).status()));

  MakeBackend(1);
  EXPECT_TRUE(absl::IsNotFound(backend_->AttachedViews(0).status()));
  v1::CudaIpcBuffers buffers;
  auto channel = ShmExpertConnection::Create(shm_test::ScopedShmName("ipc").str(), kMaxTokens,
                                             config().top_k, config().hidden_size);
  ASSERT_TRUE(channel.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      backend_->Attach(1, *std::move(channel), buffers, "", true).status()));
  Connect(0);
  const LayerInput too_many = Input(kMaxTokens + 1, 1);
  Tensor out;
  EXPECT_TRUE(
      absl::IsInvalidArgument(backend_->RunExperts(0, too_many.tensor, too_many.routing, out)));
  const LayerInput in = Input(2, 2);
  const Tensor on_host = Tensor::Host(2, config().hidden_size);
  EXPECT_TRUE(absl::IsInvalidArgument(backend_->RunExperts(0, on_host, in.routing, out)));
  EXPECT_TRUE(workers_[0]->received().empty());
  EXPECT_EQ(backend_->reroutes(), 0);
}

}  // namespace
}  // namespace strata::ipc_test
