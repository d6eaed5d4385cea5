// An ExpertBackend for callers whose activations live in host memory (an expert worker fed
// over shared memory): stages the float32 inputs and the routing onto the device, runs a
// CudaExpertBackend, and brings the float32 partial sums back. One host round trip per layer;
// the device-resident path (CUDA IPC buffers) avoids it.
#ifndef STRATA_COMMON_BACKEND_CUDA_STAGED_EXPERT_BACKEND_H_
#define STRATA_COMMON_BACKEND_CUDA_STAGED_EXPERT_BACKEND_H_

#include <memory>
#include <vector>

#include "common/backend/cuda/cuda_expert_backend.h"

namespace strata::gpu {

class StagedCudaExpertBackend : public ExpertBackend {
 public:
  // Owns the context and the device experts.
  static absl::StatusOr<std::unique_ptr<StagedCudaExpertBackend>> Create(
      const ModelConfig& config, const ExpertWeightSource& experts, int device,
      CudaExpertOptions options);

  // `x` and `routing` on the host; `out` becomes a host tensor.
  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;

 private:
  StagedCudaExpertBackend() = default;

  std::unique_ptr<CudaContext> context_;
  std::unique_ptr<CudaExpertBackend> experts_;
  int max_tokens_ = 0;
  int64_t hidden_ = 0;
  DeviceBuffer<bf16> x_;
  DeviceBuffer<int32_t> ids_;
  DeviceBuffer<float> weights_;
  PinnedBuffer<uint16_t> host_x_, host_out_;
  PinnedBuffer<int32_t> host_ids_;
  PinnedBuffer<float> host_weights_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_STAGED_EXPERT_BACKEND_H_
