// The fixture of the IpcExpertBackend tests: the router's backend on one GPU with its workers'
// ends in this process (tests/testing/fake_ipc_worker.h), each worker running the experts on a
// CudaExpertBackend of its own, and the same experts run directly for reference. Skips
// without a GPU.
#ifndef STRATA_TESTS_SERVICES_ROUTER_IPC_EXPERT_FIXTURE_H_
#define STRATA_TESTS_SERVICES_ROUTER_IPC_EXPERT_FIXTURE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/backend/cuda/cuda_expert_backend.h"
#include "common/cuda/cuda_context.h"
#include "common/model/model_weights.h"
#include "common/tensor/dtype.h"
#include "gtest/gtest.h"
#include "services/router/ipc_expert_backend.h"
#include "tests/common/shm/shm_test_util.h"
#include "tests/testing/fake_ipc_worker.h"

namespace strata::ipc_test {

using Faults = ::strata::testing::FakeIpcWorker::Faults;

// 3 MoE layers of 8 experts, top 2, hidden size 128.
inline const std::string kModel = std::string(STRATA_TEST_DATA_DIR) + "/oracles/qwen3_moe_hd64";
inline constexpr int kMaxTokens = 8;
// Failure guards only: every wait ends as soon as what it waits for happens.
inline constexpr absl::Duration kGuard = absl::Seconds(30);

// One MoE layer's input as the router's stream hands it over: activations and routing on the
// device, and their host copies for the references.
struct LayerInput {
  int64_t n = 0;
  std::vector<uint16_t> x;  // bf16 [n, hidden]
  std::vector<int32_t> ids;
  std::vector<float> weights;
  gpu::DeviceBuffer<gpu::bf16> device_x;
  gpu::DeviceBuffer<int32_t> device_ids;
  gpu::DeviceBuffer<float> device_weights;
  Tensor tensor;
  RoutingTable routing;
};

class IpcExpertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A held worker stream and the router's, waiting on it, must not share a hardware queue
    // (the driver maps streams onto 8 by default; processes, as in the cluster, share none).
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto model = LoadModel(kModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    source_ = std::make_unique<ModelExpertSource>(model_->weights);
    ASSERT_EQ(config().num_experts, 8);
    ASSERT_EQ(config().top_k, 2);
    auto context = gpu::CudaContext::Create({.device = 0});
    ASSERT_TRUE(context.ok()) << context.status();
    router_context_ = *std::move(context);
    reference_ = Experts();
  }

  const ModelConfig& config() const { return model_->config; }
  cudaStream_t router_stream() const { return router_context_->stream(); }

  // A CudaExpertBackend over the model's experts, on a stream of its own.
  std::unique_ptr<gpu::CudaExpertBackend> Experts() {
    auto context = gpu::CudaContext::Create({.device = 0});
    EXPECT_TRUE(context.ok()) << context.status();
    if (!context.ok()) return nullptr;
    contexts_.push_back(*std::move(context));
    gpu::CudaExpertOptions options;
    options.max_tokens = kMaxTokens;
    auto experts =
        gpu::CudaExpertBackend::Create(config(), *source_, contexts_.back().get(), options);
    EXPECT_TRUE(experts.ok()) << experts.status();
    return experts.ok() ? *std::move(experts) : nullptr;
  }

  // The backend with the experts split evenly between `workers` (contiguous ranges), none
  // connected yet.
  void MakeBackend(int workers) {
    auto backend = IpcExpertBackend::Create(
        config(), PlacementPlan::Contiguous(config().num_layers, config().num_experts, workers),
        WorkerExpertOptions{.timeout = kGuard}, router_context_.get(), kMaxTokens);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    worker_experts_.resize(workers);
    workers_.resize(workers);
    links_.resize(workers);
  }

  // Registers worker `w` (again) as the router's Coordinator does: its channel, Attach, its
  // end started on the link, then SetConnection. A worker it replaces is gone first.
  void Connect(int w, Faults faults = {}, bool graph_steps = true, bool wants_prefetch = false) {
    if (workers_[w] != nullptr) workers_[w]->Die();
    if (worker_experts_[w] == nullptr) worker_experts_[w] = Experts();
    ASSERT_NE(worker_experts_[w], nullptr);
    names_.push_back(std::make_unique<shm_test::ScopedShmName>("ipc"));
    const std::string& name = names_.back()->str();
    auto channel = ShmExpertConnection::Create(name, kMaxTokens, config().top_k,
                                               config().hidden_size, kIpcSpinUs);
    ASSERT_TRUE(channel.ok()) << channel.status();
    v1::CudaIpcBuffers buffers;
    auto connection = backend_->Attach(w, *std::move(channel), buffers, "", graph_steps);
    ASSERT_TRUE(connection.ok()) << connection.status();
    auto views = backend_->AttachedViews(w);
    ASSERT_TRUE(views.ok()) << views.status();
    auto worker = testing::FakeIpcWorker::Start(name, *views, config(), *worker_experts_[w],
                                                kMaxTokens, faults);
    ASSERT_TRUE(worker.ok()) << worker.status();
    // The old end goes only now: it may still point into the link it replaces.
    workers_[w] = *std::move(worker);
    links_[w] = std::static_pointer_cast<CudaIpcConnection>(*connection);
    backend_->SetConnection(w, *connection, wants_prefetch);
  }

  // n tokens of a layer's input; token t picks experts t and t + 4 (mod 8): one of each half,
  // so that with two workers every token goes to both.
  LayerInput Input(int64_t n, uint32_t seed) {
    const int64_t h = config().hidden_size;
    const int k = config().top_k;
    const int e = config().num_experts;
    LayerInput in;
    in.n = n;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    in.x.resize(static_cast<size_t>(n * h));
    for (uint16_t& v : in.x) v = FloatToBf16(normal(rng));
    for (int64_t t = 0; t < n; ++t) {
      in.ids.push_back(static_cast<int32_t>(t % e));
      in.ids.push_back(static_cast<int32_t>((t + e / 2) % e));
      const float w = 0.2f + 0.6f * static_cast<float>(rng() % 100) / 100.0f;
      in.weights.push_back(w);
      in.weights.push_back(1.0f - w);
    }
    in.device_x = Upload<gpu::bf16>(in.x.data(), in.x.size());
    in.device_ids = Upload<int32_t>(in.ids.data(), in.ids.size());
    in.device_weights = Upload<float>(in.weights.data(), in.weights.size());
    in.tensor = Tensor::DeviceView(in.device_x.data(), n, h);
    in.routing.top_k = k;
    in.routing.tokens = n;
    in.routing.device_expert = in.device_ids.data();
    in.routing.device_weight = in.device_weights.data();
    return in;
  }

  // The layer run directly on the reference experts: only worker `keep_worker`'s (the others'
  // slots -1 with weight 0, as the split hands that worker its routing), or every expert.
  std::vector<uint16_t> Direct(int layer, const LayerInput& in, int keep_worker = -1) {
    std::vector<int32_t> ids = in.ids;
    std::vector<float> weights = in.weights;
    if (keep_worker >= 0) {
      const std::vector<int>& owner = backend_->placement().owner[layer];
      for (size_t s = 0; s < ids.size(); ++s) {
        if (owner[ids[s]] == keep_worker) continue;
        ids[s] = -1;
        weights[s] = 0.0f;
      }
    }
    const int64_t h = config().hidden_size;
    auto device_ids = Upload<int32_t>(ids.data(), ids.size());
    auto device_weights = Upload<float>(weights.data(), weights.size());
    auto out = *gpu::DeviceBuffer<gpu::bf16>::Allocate(static_cast<size_t>(in.n * h));
    EXPECT_TRUE(reference_
                    ->RunExpertsInto(layer, in.device_x.data(), device_ids.data(),
                                     device_weights.data(), in.n, config().top_k, out.data())
                    .ok());
    EXPECT_EQ(cudaStreamSynchronize(reference_->context()->stream()), cudaSuccess);
    return Download<uint16_t>(out.data(), static_cast<size_t>(in.n * h));
  }

  // Runs the layer through the backend and waits for the router's stream.
  absl::StatusOr<std::vector<uint16_t>> Run(int layer, const LayerInput& in) {
    Tensor out;
    if (absl::Status s = backend_->RunExperts(layer, in.tensor, in.routing, out); !s.ok()) return s;
    if (!WaitForStream(router_stream())) return absl::DeadlineExceededError("router's stream");
    return Download<uint16_t>(out.device_data(), static_cast<size_t>(out.size()));
  }

  // Worker w's output buffer (its last partial), n rows.
  std::vector<uint16_t> Partial(int w, int64_t n) {
    return Download<uint16_t>(links_[w]->buffers().output(),
                              static_cast<size_t>(n * config().hidden_size));
  }

  // Link w's flags, [2][num_layers], once everything queued on the device is done.
  std::vector<uint32_t> Flags(int w) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return Download<uint32_t>(links_[w]->buffers().flags(), 2 * config().num_layers);
  }

  // Whether `stream` finished what it has queued within kGuard.
  static bool WaitForStream(cudaStream_t stream) {
    const absl::Time deadline = absl::Now() + kGuard;
    cudaError_t state = cudaStreamQuery(stream);
    while (state == cudaErrorNotReady && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      state = cudaStreamQuery(stream);
    }
    return state == cudaSuccess;
  }

  template <typename T>
  static gpu::DeviceBuffer<T> Upload(const void* data, size_t count) {
    auto buffer = *gpu::DeviceBuffer<T>::Allocate(count);
    EXPECT_EQ(cudaMemcpy(buffer.data(), data, count * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return buffer;
  }
  template <typename T>
  static std::vector<T> Download(const void* data, size_t count) {
    std::vector<T> out(count);
    EXPECT_EQ(cudaMemcpy(out.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelExpertSource> source_;
  // Destroyed in reverse: the workers' ends first (they point into the backend's links), then
  // the backend, the experts and their contexts.
  std::vector<std::unique_ptr<gpu::CudaContext>> contexts_;
  std::unique_ptr<gpu::CudaContext> router_context_;
  std::unique_ptr<gpu::CudaExpertBackend> reference_;
  std::vector<std::unique_ptr<gpu::CudaExpertBackend>> worker_experts_;
  std::vector<std::unique_ptr<shm_test::ScopedShmName>> names_;
  std::unique_ptr<IpcExpertBackend> backend_;
  std::vector<std::shared_ptr<CudaIpcConnection>> links_;
  std::vector<std::unique_ptr<testing::FakeIpcWorker>> workers_;
};

}  // namespace strata::ipc_test

#endif  // STRATA_TESTS_SERVICES_ROUTER_IPC_EXPERT_FIXTURE_H_
