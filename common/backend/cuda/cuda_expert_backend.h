// Routed experts on a CUDA device: every expert of every MoE layer resident in device memory
// (bf16, or FP8 E4M3 with per-output-channel scales quantized at load), all selected experts
// of a layer run by one grouped launch per stage.
#ifndef STRATA_COMMON_BACKEND_CUDA_CUDA_EXPERT_BACKEND_H_
#define STRATA_COMMON_BACKEND_CUDA_CUDA_EXPERT_BACKEND_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/cuda/device_experts.h"
#include "common/backend/graph_step.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/model/model_weights.h"

namespace strata::gpu {

struct CudaExpertOptions {
  WeightFormat format = WeightFormat::kBf16;
  int max_tokens = 512;
  // Called after each MoE layer is on the device (progress output for large models).
  std::function<void(int layer, int num_layers, uint64_t bytes)> on_layer;
};

// The grouped-expert kernels' activation for `config`'s experts.
GluParams ExpertGluParams(const ModelConfig& config);

class CudaExpertBackend : public ExpertBackend, public GraphStepExperts, public DeviceExperts {
 public:
  static absl::StatusOr<std::unique_ptr<CudaExpertBackend>> Create(
      const ModelConfig& config, const ExpertWeightSource& experts, CudaContext* context,
      CudaExpertOptions options);

  // `x` is a device tensor [n, hidden] bf16 and `routing` holds device arrays (as
  // CudaRouterBackend produces them); `out` becomes a device view [n, hidden] bf16.
  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;
  // DeviceExperts: the same on raw device arrays (also another process's buffers opened by
  // CUDA IPC).
  absl::Status RunExpertsInto(int layer, const bf16* x, const int32_t* ids, const float* weights,
                              int64_t n, int top_k, bf16* out,
                              const GridSignal& signal = {}) override;
  CudaContext* context() const override { return context_; }
  DeviceExperts* device_experts() override { return this; }
  // Everything is resident and queued on the router's stream: always capturable.
  GraphStepExperts* graph_steps() override { return this; }
  uint64_t graph_version() const override { return 1; }

 private:
  CudaExpertBackend(const ModelConfig& config, CudaContext* context, CudaExpertOptions options)
      : config_(config), context_(context), options_(std::move(options)) {}
  absl::Status LoadLayer(int layer, const ExpertWeightSource& experts);

  struct Layer {
    ExpertWeightTable table;
    DeviceBuffer<uint8_t> storage;   // every expert's matrices, scales and biases
    DeviceBuffer<uint8_t> pointers;  // the table's device pointer arrays
  };
  const ModelConfig& config_;
  CudaContext* context_;
  CudaExpertOptions options_;
  std::vector<Layer> layers_;
  DeviceBuffer<uint16_t> staging_;       // one bf16 matrix on its way to FP8
  PinnedBuffer<uint16_t> host_staging_;  // one expert repacked on the host
  DeviceBuffer<uint8_t> workspace_;
  DeviceBuffer<bf16> out_;
  std::shared_ptr<void> keep_alive_ = std::make_shared<int>(0);
  uint64_t bytes_ = 0;  // on the device so far, for progress lines
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_CUDA_EXPERT_BACKEND_H_
