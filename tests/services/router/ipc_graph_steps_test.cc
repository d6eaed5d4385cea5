// IpcExpertBackend's part in decode-step CUDA graphs (ipc_graph_steps.cc) against workers' ends
// in this process (tests/testing/fake_ipc_worker.h): the graph version, what a captured step
// records and each replay's kDeviceStep messages, and the bookkeeping of replays in flight
// (graph_awaited), of a worker that does not start a step, registers again since the capture,
// or dies while a replay waits on it. No replay is launched: the workers' graphs and the
// router's wait on each other's flags, which the cluster tests exercise across processes.
// Skips without a GPU.
#include <vector>

#include "absl/strings/match.h"
#include "common/cuda/grid_signal.h"
#include "tests/services/router/ipc_expert_fixture.h"

namespace strata::ipc_test {
namespace {

using Received = ::strata::testing::FakeIpcWorker::Received;

class IpcGraphStepsTest : public IpcExpertTest {
 protected:
  // An eager step through every layer: it puts each layer's owners on the device, which a
  // capture cannot.
  void EagerStep(const LayerInput& in) {
    for (int layer = 0; layer < config().num_layers; ++layer) {
      auto out = Run(layer, in);
      ASSERT_TRUE(out.ok()) << out.status();
    }
    ASSERT_TRUE(backend_->FinishStep().ok());
  }

  // Captures a decode step through every layer as DecodeGraphs does; the graph is dropped.
  absl::Status CaptureStep(const LayerInput& in) {
    backend_->SetGraphCapture(true);
    if (cudaStreamBeginCapture(router_stream(), cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      return absl::InternalError("cannot begin the capture");
    }
    absl::Status status;
    for (int layer = 0; layer < config().num_layers && status.ok(); ++layer) {
      Tensor out;
      status = backend_->RunExperts(layer, in.tensor, in.routing, out);
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(router_stream(), &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    backend_->SetGraphCapture(false);
    cudaGetLastError();
    if (status.ok() && ended != cudaSuccess) return absl::InternalError("capture failed");
    return status;
  }

  // Two workers (worker 1 with `faults`) and a step of `in` captured after an eager one.
  void CaptureWithTwoWorkers(const LayerInput& in, Faults faults = {}) {
    MakeBackend(2);
    Connect(0);
    Connect(1, faults);
    EagerStep(in);
    ASSERT_TRUE(CaptureStep(in).ok());
  }

  // The step's replay announced to the workers and their answers collected.
  absl::Status Replay(int64_t tokens) {
    if (absl::Status s = backend_->BeginGraphStep(tokens); !s.ok()) return s;
    return backend_->AwaitGraphStep();
  }

  std::vector<int32_t> AllLayers() const {
    std::vector<int32_t> layers;
    for (int l = 0; l < config().num_layers; ++l) layers.push_back(l);
    return layers;
  }

  // Whether `done` holds within kGuard (a condition another thread makes true).
  template <typename Done>
  static bool Eventually(Done done) {
    const absl::Time deadline = absl::Now() + kGuard;
    while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    return done();
  }
};

TEST_F(IpcGraphStepsTest, GraphVersionFollowsTheWorkersAndTheOwners) {
  MakeBackend(2);
  EXPECT_EQ(backend_->graph_version(), 0u) << "no worker connected";
  Connect(0);
  Connect(1);
  const uint64_t both = backend_->graph_version();
  EXPECT_NE(both, 0u);
  EXPECT_EQ(backend_->graph_version(), both);
  Connect(1);
  const uint64_t again = backend_->graph_version();
  EXPECT_NE(again, 0u);
  EXPECT_NE(again, both) << "a worker registered again";
  Connect(1, {}, /*graph_steps=*/false);
  EXPECT_EQ(backend_->graph_version(), 0u) << "a worker that cannot run graph steps";
  Connect(1);
  const uint64_t capturable = backend_->graph_version();
  EXPECT_NE(capturable, 0u);
  workers_[1]->Die();
  const uint64_t one_gone = backend_->graph_version();
  EXPECT_NE(one_gone, 0u);
  EXPECT_NE(one_gone, capturable) << "a worker went";
  // An eager step moves its experts to worker 0: the owners a captured split routes by.
  ASSERT_TRUE(Run(0, Input(2, 1)).ok());
  EXPECT_NE(backend_->graph_version(), one_gone);
  EXPECT_NE(backend_->graph_version(), 0u);
}

TEST_F(IpcGraphStepsTest, ACaptureNeedsTheOwnersAnEagerStepPutOnTheDevice) {
  MakeBackend(1);
  Connect(0);
  const LayerInput in = Input(1, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(CaptureStep(in)));
  EagerStep(in);
  EXPECT_TRUE(CaptureStep(in).ok());
}

TEST_F(IpcGraphStepsTest, EachReplayStartsEachWorkersGraphOfTheCapturedLayers) {
  const LayerInput in = Input(2, 3);
  ASSERT_NO_FATAL_FAILURE(CaptureWithTwoWorkers(in));
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(workers_[w]->received(ExpertMessageKind::kDeviceStep).empty())
        << "a capture sends nothing";
    EXPECT_EQ(workers_[w]->received(ExpertMessageKind::kDeviceRun).size(), 3u);
  }
  ASSERT_TRUE(Replay(2).ok());
  // A second replay launched behind the first, before either finished.
  ASSERT_TRUE(Replay(2).ok());
  for (int w = 0; w < 2; ++w) {
    const std::vector<Received> steps = workers_[w]->received(ExpertMessageKind::kDeviceStep);
    ASSERT_EQ(steps.size(), 2u);
    for (const Received& s : steps) {
      EXPECT_EQ(s.num_tokens, 2u);
      EXPECT_EQ(s.top_k, 2u);
      EXPECT_EQ(s.hidden_size, static_cast<uint32_t>(config().hidden_size));
      EXPECT_EQ(s.layers, AllLayers());
    }
    EXPECT_LT(steps[0].step, steps[1].step);
    EXPECT_EQ(steps[0].step, workers_[1 - w]->received(ExpertMessageKind::kDeviceStep)[0].step);
    EXPECT_EQ(links_[w]->graph_awaited.load(), 2) << "worker " << w;
  }
  // Replays finish in launch order, each letting go of the workers it started.
  ASSERT_TRUE(backend_->FinishStep().ok());
  EXPECT_EQ(links_[0]->graph_awaited.load(), 1);
  ASSERT_TRUE(backend_->FinishStep().ok());
  EXPECT_EQ(links_[0]->graph_awaited.load(), 0);
  EXPECT_EQ(links_[1]->graph_awaited.load(), 0);
}

TEST_F(IpcGraphStepsTest, AWorkerThatDoesNotStartAStepHasItsFlagsReleasedThenCleared) {
  const LayerInput in = Input(1, 4);
  ASSERT_NO_FATAL_FAILURE(CaptureWithTwoWorkers(in, {.fail_step_on = 1}));
  const absl::Status started = Replay(1);
  EXPECT_TRUE(absl::IsUnavailable(started)) << started;
  EXPECT_TRUE(absl::StrContains(started.message(), "not launched")) << started;
  EXPECT_EQ(links_[0]->graph_awaited.load(), 1);
  EXPECT_EQ(links_[1]->graph_awaited.load(), 0);
  // The replay would wait for worker 1's output flags: they are released for good...
  const int layers = config().num_layers;
  std::vector<uint32_t> flags = Flags(1);
  for (int l = 0; l < layers; ++l) {
    EXPECT_EQ(flags[l], 0u) << "input flag " << l;
    EXPECT_EQ(flags[layers + l], gpu::kFlagReleased) << "output flag " << l;
  }
  // ... until the step is over.
  EXPECT_TRUE(backend_->FinishStep().ok());
  EXPECT_EQ(links_[0]->graph_awaited.load(), 0);
  EXPECT_EQ(Flags(1), std::vector<uint32_t>(2 * layers, 0u));
  // It answered: still connected, and the next step starts on both.
  EXPECT_TRUE(backend_->connected(1));
  EXPECT_TRUE(Replay(1).ok());
  EXPECT_EQ(links_[1]->graph_awaited.load(), 1);
  EXPECT_TRUE(backend_->FinishStep().ok());
}

TEST_F(IpcGraphStepsTest, AReplayIsRefusedWhenAWorkerRegisteredAgainSinceTheCapture) {
  const LayerInput in = Input(2, 5);
  ASSERT_NO_FATAL_FAILURE(CaptureWithTwoWorkers(in));
  const uint64_t captured = backend_->graph_version();
  Connect(0);
  EXPECT_NE(backend_->graph_version(), captured) << "the caller captures again";
  const absl::Status begun = backend_->BeginGraphStep(2);
  EXPECT_TRUE(absl::IsUnavailable(begun)) << begun;
  EXPECT_TRUE(absl::StrContains(begun.message(), "decode graphs were made with")) << begun;
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(workers_[w]->received(ExpertMessageKind::kDeviceStep).empty());
    EXPECT_EQ(links_[w]->graph_awaited.load(), 0);
  }
}

TEST_F(IpcGraphStepsTest, AWorkerThatDiesDuringAReplayIsReleasedAndTheStepLost) {
  const LayerInput in = Input(2, 6);
  ASSERT_NO_FATAL_FAILURE(CaptureWithTwoWorkers(in));
  ASSERT_TRUE(Replay(2).ok());
  ASSERT_EQ(links_[1]->graph_awaited.load(), 1);
  workers_[1]->Die();
  // The watchdog notices and releases the output flags the replay waits on.
  ASSERT_TRUE(Eventually([&] { return links_[1]->graph_awaited.load() == 0; }));
  const std::vector<uint32_t> flags = Flags(1);
  for (int l = 0; l < config().num_layers; ++l) {
    EXPECT_EQ(flags[config().num_layers + l], gpu::kFlagReleased) << "output flag " << l;
  }
  const absl::Status finished = backend_->FinishStep();
  EXPECT_TRUE(absl::IsAborted(finished)) << finished;
  EXPECT_EQ(links_[0]->graph_awaited.load(), 0);
  EXPECT_TRUE(backend_->FinishStep().ok()) << "the lost step is reported once";
  EXPECT_NE(backend_->graph_version(), 0u) << "worker 0 can still run captured steps";
}

}  // namespace
}  // namespace strata::ipc_test
