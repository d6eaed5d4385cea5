// CoordinatorService::Register without gRPC or worker processes: what a registration is told
// (its channel, transport, experts, calibration, hot ratio), what it installs in the router's
// WorkerExpertBackend, and the registrations it refuses with a reason.
#include "services/router/coordinator_service.h"

#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/protocol_version.h"
#include "common/model/model_config.h"
#include "gtest/gtest.h"
#include "services/router/worker_expert_backend.h"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe";

// The router's expert backend, its installed connections in view.
class InspectedExperts : public WorkerExpertBackend {
 public:
  using WorkerExpertBackend::Connections;
  using WorkerExpertBackend::WorkerExpertBackend;
};

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ModelConfig> config = LoadModelConfig(kModel);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *std::move(config);
    experts_ = std::make_unique<InspectedExperts>(
        config_, PlacementPlan::Contiguous(config_.num_layers, config_.num_experts, kWorkers),
        WorkerExpertOptions{});
    // Channel names unique to this process: tests run in parallel.
    options_.channel_prefix = absl::StrCat("strata-coord-test-", ::getpid());
    options_.max_tokens_per_step = 8;
  }

  v1::RegisterWorkerRequest Request(int index, uint64_t incarnation = 1) const {
    v1::RegisterWorkerRequest request;
    request.set_worker_index(index);
    request.set_device("cpu");
    request.set_incarnation(incarnation);
    request.set_transport(v1::TRANSPORT_SHARED_MEMORY);
    request.set_protocol_version(kClusterProtocolVersion);
    return request;
  }

  static constexpr int kWorkers = 2;
  ModelConfig config_;
  std::unique_ptr<InspectedExperts> experts_;
  CoordinatorOptions options_;
};

TEST_F(CoordinatorServiceTest, AWorkerLearnsItsChannelAndExperts) {
  options_.calibration.assign(config_.num_layers, std::vector<int64_t>(config_.num_experts, 0));
  options_.calibration[0][config_.num_experts - 1] = 7;
  experts_->set_hot_ratio(0.25f);
  CoordinatorService coordinator(config_, *experts_, options_);
  for (int w = 0; w < kWorkers; ++w) {
    v1::RegisterWorkerResponse response;
    ASSERT_TRUE(coordinator.Register(Request(w), response).ok());
    EXPECT_EQ(response.transport(), v1::TRANSPORT_SHARED_MEMORY);
    EXPECT_EQ(response.channel_name(), absl::StrCat(options_.channel_prefix, "-w", w, "-1"));
    EXPECT_EQ(response.num_workers(), kWorkers);
    EXPECT_FLOAT_EQ(response.hot_ratio(), 0.25f);
    // Every MoE layer, with exactly the experts the placement gives this worker.
    std::set<int> layers;
    for (const v1::ExpertRange& range : response.owned()) {
      layers.insert(static_cast<int>(range.layer()));
      const std::vector<int> want = experts_->placement().OwnedBy(range.layer(), w);
      EXPECT_EQ(std::vector<int>(range.experts().begin(), range.experts().end()), want);
    }
    int moe_layers = 0;
    for (int layer = 0; layer < config_.num_layers; ++layer)
      moe_layers += config_.layer_is_moe[layer];
    EXPECT_EQ(static_cast<int>(layers.size()), moe_layers);
    // The calibration of the experts it owns, and only those.
    int counted = 0;
    for (const v1::ExpertCount& count : response.calibration()) {
      const std::vector<int> owned = experts_->placement().OwnedBy(count.layer(), w);
      EXPECT_NE(std::find(owned.begin(), owned.end(), static_cast<int>(count.expert())),
                owned.end());
      if (count.count() == 7) ++counted;
    }
    EXPECT_EQ(counted, w == kWorkers - 1 ? 1 : 0) << "worker " << w;
  }
  EXPECT_EQ(experts_->Connections().size(), static_cast<size_t>(kWorkers));
  for (const auto& connection : experts_->Connections()) EXPECT_NE(connection, nullptr);
  // A CPU worker on shared memory shares the host's memory with a CPU router.
  EXPECT_TRUE(experts_->shares_memory(0));
  EXPECT_EQ(coordinator.restarts(), 0);
}

TEST_F(CoordinatorServiceTest, ARestartedWorkerGetsANewChannelAndIsCounted) {
  CoordinatorService coordinator(config_, *experts_, options_);
  v1::RegisterWorkerResponse first, second;
  ASSERT_TRUE(coordinator.Register(Request(1, 5), first).ok());
  const std::shared_ptr<ExpertConnection> before = experts_->Connections()[1];
  ASSERT_TRUE(coordinator.Register(Request(1, 6), second).ok());
  EXPECT_NE(first.channel_name(), second.channel_name());
  EXPECT_NE(experts_->Connections()[1], before) << "the new connection replaces the old";
  EXPECT_EQ(coordinator.restarts(), 1);
}

TEST_F(CoordinatorServiceTest, RefusesWithAReason) {
  CoordinatorService coordinator(config_, *experts_, options_);
  v1::RegisterWorkerResponse response;
  v1::RegisterWorkerRequest old_build = Request(0);
  old_build.set_protocol_version(kClusterProtocolVersion - 1);
  absl::Status status = coordinator.Register(old_build, response);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "same build")) << status;

  status = coordinator.Register(Request(kWorkers), response);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "outside")) << status;

  v1::RegisterWorkerRequest unknown = Request(0);
  unknown.set_transport(static_cast<v1::Transport>(99));
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator.Register(unknown, response)));
  // Nothing was installed by the refusals.
  for (const auto& connection : experts_->Connections()) EXPECT_EQ(connection, nullptr);
}

// A GPU router takes only CUDA IPC workers, and hands those to its cuda_ipc hook with the
// channel made for them.
TEST_F(CoordinatorServiceTest, AGpuRouterTakesOnlyCudaIpcWorkers) {
  int hooked = 0;
  std::string hooked_channel_of;
  options_.router_device = "cuda:0";
  options_.router_gpu_uuid = "uuid-of-the-router";
  options_.cuda_ipc =
      [&](const v1::RegisterWorkerRequest& request, std::unique_ptr<ShmExpertConnection> channel,
          v1::CudaIpcBuffers&) -> absl::StatusOr<std::shared_ptr<ExpertConnection>> {
    ++hooked;
    hooked_channel_of = request.device();
    return std::shared_ptr<ExpertConnection>(std::move(channel));
  };
  CoordinatorService coordinator(config_, *experts_, options_);
  v1::RegisterWorkerResponse response;
  absl::Status status = coordinator.Register(Request(0), response);  // shared memory
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "only CUDA IPC")) << status;
  EXPECT_EQ(hooked, 0);

  v1::RegisterWorkerRequest ipc = Request(0);
  ipc.set_transport(v1::TRANSPORT_CUDA_IPC);
  ipc.set_device("cuda:0");
  ipc.set_gpu_uuid("uuid-of-the-router");
  ASSERT_TRUE(coordinator.Register(ipc, response).ok());
  EXPECT_EQ(hooked, 1);
  EXPECT_EQ(hooked_channel_of, "cuda:0");
  EXPECT_EQ(response.transport(), v1::TRANSPORT_CUDA_IPC);
  EXPECT_TRUE(experts_->shares_memory(0)) << "the same GPU as the router";

  ipc.set_worker_index(1);
  ipc.set_gpu_uuid("another-gpu");
  ASSERT_TRUE(coordinator.Register(ipc, response).ok());
  EXPECT_FALSE(experts_->shares_memory(1));
}

}  // namespace
}  // namespace strata
