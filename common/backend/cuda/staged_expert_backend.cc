#include "common/backend/cuda/staged_expert_backend.h"

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "common/util/status_macros.h"

namespace strata::gpu {

absl::StatusOr<std::unique_ptr<StagedCudaExpertBackend>> StagedCudaExpertBackend::Create(
    const ModelConfig& config, const ExpertWeightSource& experts, int device,
    CudaExpertOptions options) {
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", device, " does not exist (", CudaDeviceCount(), " CUDA devices)"));
  }
  std::unique_ptr<StagedCudaExpertBackend> b(new StagedCudaExpertBackend());
  ASSIGN_OR_RETURN(b->context_, CudaContext::Create({.device = device}));
  b->max_tokens_ = options.max_tokens;
  b->hidden_ = config.hidden_size;
  ASSIGN_OR_RETURN(b->experts_,
                   CudaExpertBackend::Create(config, experts, b->context_.get(), options));
  const size_t t = static_cast<size_t>(options.max_tokens);
  const size_t slots = t * std::max(config.top_k, 1);
  ASSIGN_OR_RETURN(b->x_, DeviceBuffer<bf16>::Allocate(t * b->hidden_));
  ASSIGN_OR_RETURN(b->ids_, DeviceBuffer<int32_t>::Allocate(slots));
  ASSIGN_OR_RETURN(b->weights_, DeviceBuffer<float>::Allocate(slots));
  ASSIGN_OR_RETURN(b->host_x_, PinnedBuffer<uint16_t>::Allocate(t * b->hidden_));
  ASSIGN_OR_RETURN(b->host_out_, PinnedBuffer<uint16_t>::Allocate(t * b->hidden_));
  ASSIGN_OR_RETURN(b->host_ids_, PinnedBuffer<int32_t>::Allocate(slots));
  ASSIGN_OR_RETURN(b->host_weights_, PinnedBuffer<float>::Allocate(slots));
  return b;
}

absl::Status StagedCudaExpertBackend::RunExperts(int layer, const Tensor& x,
                                                 const RoutingTable& routing, Tensor& out) {
  const int64_t n = x.rows();
  const size_t slots = routing.expert.size();
  if (x.device() != Device::kCpu || routing.on_device() || x.cols() != hidden_) {
    return absl::InvalidArgumentError("staged cuda experts: host input expected");
  }
  if (n > max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged cuda experts: ", n, " tokens; the limit is ", max_tokens_));
  }
  for (int64_t i = 0; i < n * hidden_; ++i) host_x_.data()[i] = FloatToBf16(x.data()[i]);
  std::copy(routing.expert.begin(), routing.expert.end(), host_ids_.data());
  std::copy(routing.weight.begin(), routing.weight.end(), host_weights_.data());
  cudaStream_t stream = context_->stream();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(x_.data(), host_x_.data(), n * hidden_ * 2, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_.data(), host_ids_.data(), slots * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(weights_.data(), host_weights_.data(), slots * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
  RoutingTable device_routing;
  device_routing.top_k = routing.top_k;
  device_routing.tokens = n;
  device_routing.device_expert = ids_.data();
  device_routing.device_weight = weights_.data();
  Tensor device_out;
  RETURN_IF_ERROR(experts_->RunExperts(layer, Tensor::DeviceView(x_.data(), n, hidden_),
                                       device_routing, device_out));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out_.data(), device_out.device_data(), n * hidden_ * 2,
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  out.Resize(n, hidden_);
  for (int64_t i = 0; i < n * hidden_; ++i) out.data()[i] = Bf16ToFloat(host_out_.data()[i]);
  return absl::OkStatus();
}

}  // namespace strata::gpu
