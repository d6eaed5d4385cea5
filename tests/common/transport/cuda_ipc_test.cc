// Both ends of TRANSPORT_CUDA_IPC in one process: the router's link buffers (RouterLink) and a
// worker's end attached to them (AttachWorkerLink) over a CudaExpertBackend, against the same
// experts run directly. An eager layer goes by events, a replayed decode step by flags, as in
// the cluster, with no process or channel in between. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/grid_signal.h"
#include "common/cuda/kernels/expert_split_kernels.h"
#include "common/cuda/stream_flags.h"
#include "common/model/model_weights.h"
#include "common/tensor/dtype.h"
#include "common/transport/cuda_ipc/router_link.h"
#include "common/transport/cuda_ipc/worker_link.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

const std::string kModel = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe_hd64";

// Both ends here are streams of one process: a stream blocked on a flag must not share a
// hardware queue with the one that raises it (the driver maps streams onto a few queues, 8 by
// default; across processes, as in the cluster, they never share one). Set before CUDA starts.
const bool kQueues = [] { return ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0) == 0; }();
constexpr int kMaxTokens = 8;

class CudaIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto model = LoadModel(kModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    source_ = std::make_unique<ModelExpertSource>(model_->weights);
    auto context = gpu::CudaContext::Create({.device = 0});
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = *std::move(context);
    auto experts = gpu::CudaExpertBackend::Create(config(), *source_, context_.get(),
                                                  {.max_tokens = kMaxTokens});
    ASSERT_TRUE(experts.ok()) << experts.status();
    experts_ = *std::move(experts);
    CUDA_OK(cudaStreamCreateWithFlags(&router_stream_, cudaStreamNonBlocking));
    cuda_ipc::LinkShape shape;
    shape.max_tokens = kMaxTokens;
    shape.top_k = static_cast<uint32_t>(config().top_k);
    shape.hidden_size = static_cast<uint32_t>(config().hidden_size);
    shape.num_layers = static_cast<uint32_t>(config().num_layers);
    // Both ends on this GPU: device scope where the waits allow it (polling kernels, under
    // MPS); the driver's wait operations see only system-scope raises.
    shape.device_scope_flags = gpu::DeviceScopeSignalsAllowed();
    auto link = cuda_ipc::RouterLink::Create(shape, router_stream_);
    ASSERT_TRUE(link.ok()) << link.status();
    router_ = *std::move(link);
    auto input = cuda_ipc::AllocateShared<gpu::bf16>(size_t{kMaxTokens} * config().hidden_size);
    ASSERT_TRUE(input.ok());
    input_ = *std::move(input);
    auto worker = AttachWorkerLink(router_->views(input_.data()), config(), *experts_, kMaxTokens);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    auto done = gpu::DeviceBuffer<uint32_t>::Allocate(1);
    ASSERT_TRUE(done.ok());
    blocks_done_ = *std::move(done);
    CUDA_OK(cudaMemset(blocks_done_.data(), 0, sizeof(uint32_t)));
  }
  void TearDown() override {
    if (worker_ != nullptr) EXPECT_TRUE(worker_->Close().ok());
    if (router_stream_ != nullptr) cudaStreamDestroy(router_stream_);
  }

  const ModelConfig& config() const { return model_->config; }

  // Writes n tokens' input and routing (each token's top_k distinct experts) into the link.
  void WriteStep(int n, uint32_t seed) {
    const int k = config().top_k;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<uint16_t> x(size_t{static_cast<size_t>(n)} * config().hidden_size);
    for (uint16_t& v : x) v = FloatToBf16(normal(rng));
    ids_.assign(static_cast<size_t>(n) * k, -1);
    weights_.assign(ids_.size(), 0.0f);
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < k; ++j) {
        int e;
        do {
          e = static_cast<int>(rng() % config().num_experts);
        } while (std::find(&ids_[t * k], &ids_[t * k] + j, e) != &ids_[t * k] + j);
        ids_[t * k + j] = e;
        weights_[t * k + j] = 0.25f + 0.5f * static_cast<float>(rng() % 100) / 100.0f;
      }
    }
    x_ = x;
    CUDA_OK(cudaMemcpy(input_.data(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(router_->ids(), ids_.data(), ids_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(router_->weights(), weights_.data(), weights_.size() * 4,
                       cudaMemcpyHostToDevice));
  }

  // The same layer run directly on the experts' stream, from copies of the step's inputs.
  std::vector<uint16_t> Direct(int layer, int n) {
    const int k = config().top_k;
    const int64_t h = config().hidden_size;
    auto x = *gpu::DeviceBuffer<gpu::bf16>::Allocate(static_cast<size_t>(n * h));
    auto ids = *gpu::DeviceBuffer<int32_t>::Allocate(static_cast<size_t>(n * k));
    auto w = *gpu::DeviceBuffer<float>::Allocate(static_cast<size_t>(n * k));
    auto out = *gpu::DeviceBuffer<gpu::bf16>::Allocate(static_cast<size_t>(n * h));
    cudaMemcpy(x.data(), x_.data(), x_.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(ids.data(), ids_.data(), ids_.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(w.data(), weights_.data(), weights_.size() * 4, cudaMemcpyHostToDevice);
    EXPECT_TRUE(
        experts_->RunExpertsInto(layer, x.data(), ids.data(), w.data(), n, k, out.data()).ok());
    cudaStreamSynchronize(context_->stream());
    std::vector<uint16_t> result(static_cast<size_t>(n * h));
    cudaMemcpy(result.data(), out.data(), result.size() * 2, cudaMemcpyDeviceToHost);
    return result;
  }

  std::vector<uint16_t> Output(int n) {
    std::vector<uint16_t> out(static_cast<size_t>(n) * config().hidden_size);
    cudaMemcpy(out.data(), router_->output(), out.size() * 2, cudaMemcpyDeviceToHost);
    return out;
  }

  ExpertRequestView Request(ExpertMessageKind kind, int n) const {
    ExpertRequestView r;
    r.kind = kind;
    r.num_tokens = static_cast<uint32_t>(n);
    r.top_k = static_cast<uint32_t>(config().top_k);
    r.hidden_size = static_cast<uint32_t>(config().hidden_size);
    return r;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelExpertSource> source_;
  std::unique_ptr<gpu::CudaContext> context_;
  std::unique_ptr<gpu::CudaExpertBackend> experts_;
  cudaStream_t router_stream_ = nullptr;
  std::unique_ptr<cuda_ipc::RouterLink> router_;
  gpu::DeviceBuffer<gpu::bf16> input_;
  gpu::DeviceBuffer<uint32_t> blocks_done_;
  std::unique_ptr<WorkerLink> worker_;
  std::vector<uint16_t> x_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
};

TEST_F(CudaIpcTest, AnEagerLayerGoesByEventsAndMatchesTheExpertsRunDirectly) {
  for (int layer = 0; layer < config().num_layers; ++layer) {
    const int n = 1 + layer * 3;
    WriteStep(n, 17 + layer);
    // The router records its input event, the worker queues the layer behind it and records
    // its output event, the router's stream waits for that.
    CUDA_OK(cudaEventRecord(router_->input_ready(), router_stream_));
    ExpertRequestView r = Request(ExpertMessageKind::kDeviceRun, n);
    r.layer = static_cast<uint32_t>(layer);
    ASSERT_TRUE(worker_->Run(r).ok());
    CUDA_OK(cudaStreamWaitEvent(router_stream_, router_->output_ready(), 0));
    CUDA_OK(cudaStreamSynchronize(router_stream_));
    EXPECT_EQ(Output(n), Direct(layer, n)) << "layer " << layer;
  }
}

TEST_F(CudaIpcTest, AReplayedStepGoesByFlagsLayerByLayer) {
  // Without MPS both ends' waits are the driver's stream memory operations, and within one
  // process the worker's replay, blocked on its flag, was seen to hold up the router's raise
  // (the H200 call of 2026-12-03 timed out here); the cluster, one process each, passes. Under
  // MPS the waits are polling kernels.
  if (!gpu::FlagWaitsPoll()) GTEST_SKIP() << "flag waits are memory operations (no MPS)";
  const int n = 2;
  std::vector<int32_t> layers;
  for (int l = 0; l < config().num_layers; ++l) layers.push_back(l);
  for (int step = 0; step < 3; ++step) {
    // The references first: while the worker's graph waits on a flag, its stream takes nothing
    // else, and no allocation may be freed (a free synchronizes the device).
    std::vector<std::vector<uint16_t>> expected;
    for (int layer : layers) {
      WriteStep(n, 100 * step + layer);
      expected.push_back(Direct(layer, n));
    }
    // The worker's graph is queued first and waits on its first input flag.
    ExpertRequestView r = Request(ExpertMessageKind::kDeviceStep, n);
    r.layers = layers;
    ASSERT_TRUE(worker_->RunStep(r).ok());
    for (int layer : layers) {
      WriteStep(n, 100 * step + layer);
      // As the router's split kernel does: lower the output flag the last step left up, raise
      // the input flag; then wait for the worker's output flag.
      gpu::GridSignal signal;
      signal.count = 1;
      signal.clear[0] = router_->output_flag(layer);
      signal.raise[0] = router_->input_flag(layer);
      signal.done = blocks_done_.data();
      signal.system = !router_->shape().device_scope_flags;
      CUDA_OK(gpu::LaunchSignal(signal, router_stream_));
      ASSERT_TRUE(gpu::WaitFlag(router_stream_, router_->output_flag(layer), 1).ok());
      CUDA_OK(cudaStreamSynchronize(router_stream_));
      EXPECT_EQ(Output(n), expected[layer]) << "step " << step << " layer " << layer;
    }
    CUDA_OK(cudaStreamSynchronize(context_->stream()));
    // Every input flag is down again, every output flag up until the next step lowers it.
    std::vector<uint32_t> flags(2 * layers.size());
    cudaMemcpy(flags.data(), router_->flags(), flags.size() * 4, cudaMemcpyDeviceToHost);
    for (size_t l = 0; l < layers.size(); ++l) {
      EXPECT_EQ(flags[l], 0u) << "input flag " << l;
      EXPECT_EQ(flags[layers.size() + l], 1u) << "output flag " << l;
    }
  }
}

TEST_F(CudaIpcTest, BadRequestsAreRefusedBeforeAnythingIsQueued) {
  ExpertRequestView r = Request(ExpertMessageKind::kDeviceRun, kMaxTokens + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(worker_->Run(r)));
  r = Request(ExpertMessageKind::kDeviceRun, 1);
  r.layer = static_cast<uint32_t>(config().num_layers);
  EXPECT_TRUE(absl::IsInvalidArgument(worker_->Run(r)));
  r = Request(ExpertMessageKind::kDeviceStep, 1);
  r.layers = {0, config().num_layers};
  EXPECT_TRUE(absl::IsInvalidArgument(worker_->RunStep(r)));
  r.layers = {};
  EXPECT_TRUE(absl::IsInvalidArgument(worker_->RunStep(r)));
  // Nothing queued: the experts' stream is idle.
  EXPECT_EQ(cudaStreamQuery(context_->stream()), cudaSuccess);
}

}  // namespace
}  // namespace strata
