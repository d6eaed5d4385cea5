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

// The host side of an expert call through pinned buffers: host float32 `x` and host routing in
// (x as bf16), the bf16 result back as float32. One call at a time.
class HostExpertStaging {
 public:
  static absl::StatusOr<HostExpertStaging> Create(int max_tokens, int top_k, int64_t hidden);

  // Checks `x` and `routing` (host, at most max_tokens rows, at most top_k slots a token) and
  // queues their copies to the device on `stream`.
  absl::Status Upload(const Tensor& x, const RoutingTable& routing, cudaStream_t stream);
  // The staged input: [n, hidden] bf16 and [n, top_k] ids and weights, valid after Upload.
  Tensor device_x() { return Tensor::DeviceView(x_.data(), n_, hidden_); }
  RoutingTable device_routing() const;
  // Copies `device_out` ([n, hidden] bf16) back, waits for `stream` and writes `out` as float32.
  absl::Status Download(const bf16* device_out, cudaStream_t stream, Tensor& out);

 private:
  int max_tokens_ = 0;
  int max_top_k_ = 0;
  int64_t hidden_ = 0;
  int64_t n_ = 0;
  int top_k_ = 0;
  DeviceBuffer<bf16> x_;
  DeviceBuffer<int32_t> ids_;
  DeviceBuffer<float> weights_;
  PinnedBuffer<uint16_t> host_x_, host_out_;
  PinnedBuffer<int32_t> host_ids_;
  PinnedBuffer<float> host_weights_;
};

class StagedCudaExpertBackend : public ExpertBackend {
 public:
  // Owns the context and the device experts.
  static absl::StatusOr<std::unique_ptr<StagedCudaExpertBackend>> Create(
      const ModelConfig& config, const ExpertWeightSource& experts, int device,
      CudaExpertOptions options);

  // `x` and `routing` on the host; `out` becomes a host tensor.
  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;

  // The device experts, for callers whose activations are already on a device (CUDA IPC).
  DeviceExperts* device_experts() override { return experts_.get(); }

 private:
  StagedCudaExpertBackend() = default;

  std::unique_ptr<CudaContext> context_;
  std::unique_ptr<CudaExpertBackend> experts_;
  HostExpertStaging staging_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_STAGED_EXPERT_BACKEND_H_
