#include "common/backend/cuda/staged_expert_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "common/util/status_macros.h"

namespace strata::gpu {

absl::StatusOr<HostExpertStaging> HostExpertStaging::Create(int max_tokens, int top_k,
                                                            int64_t hidden) {
  HostExpertStaging s;
  s.max_tokens_ = max_tokens;
  s.max_top_k_ = std::max(top_k, 1);
  s.hidden_ = hidden;
  const size_t t = static_cast<size_t>(max_tokens);
  const size_t slots = t * s.max_top_k_;
  ASSIGN_OR_RETURN(s.x_, DeviceBuffer<bf16>::Allocate(t * hidden));
  ASSIGN_OR_RETURN(s.ids_, DeviceBuffer<int32_t>::Allocate(slots));
  ASSIGN_OR_RETURN(s.weights_, DeviceBuffer<float>::Allocate(slots));
  ASSIGN_OR_RETURN(s.host_x_, PinnedBuffer<uint16_t>::Allocate(t * hidden));
  ASSIGN_OR_RETURN(s.host_out_, PinnedBuffer<uint16_t>::Allocate(t * hidden));
  ASSIGN_OR_RETURN(s.host_ids_, PinnedBuffer<int32_t>::Allocate(slots));
  ASSIGN_OR_RETURN(s.host_weights_, PinnedBuffer<float>::Allocate(slots));
  return s;
}

absl::Status HostExpertStaging::Upload(const Tensor& x, const RoutingTable& routing,
                                       cudaStream_t stream) {
  const int64_t n = x.rows();
  if (x.device() != Device::kCpu || routing.on_device() || x.cols() != hidden_) {
    return absl::InvalidArgumentError("staged cuda experts: host input expected");
  }
  if (n > max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged cuda experts: ", n, " tokens; the limit is ", max_tokens_));
  }
  const size_t slots = routing.expert.size();
  if (routing.num_tokens() != n || routing.top_k > max_top_k_ || (n > 0 && routing.top_k < 1) ||
      slots != static_cast<size_t>(n * routing.top_k) || routing.weight.size() != slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged cuda experts: routing of ", routing.num_tokens(), " tokens x ",
                     routing.top_k, " does not fit ", n, " tokens x <= ", max_top_k_));
  }
  n_ = n;
  top_k_ = routing.top_k;
  for (int64_t i = 0; i < n * hidden_; ++i) host_x_.data()[i] = FloatToBf16(x.data()[i]);
  std::copy(routing.expert.begin(), routing.expert.end(), host_ids_.data());
  std::copy(routing.weight.begin(), routing.weight.end(), host_weights_.data());
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(x_.data(), host_x_.data(), n * hidden_ * 2, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_.data(), host_ids_.data(), slots * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(weights_.data(), host_weights_.data(), slots * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

RoutingTable HostExpertStaging::device_routing() const {
  RoutingTable r;
  r.top_k = top_k_;
  r.tokens = n_;
  r.device_expert = ids_.data();
  r.device_weight = weights_.data();
  return r;
}

absl::Status HostExpertStaging::Download(const bf16* device_out, cudaStream_t stream, Tensor& out) {
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out_.data(), device_out, n_ * hidden_ * 2,
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  out.Resize(n_, hidden_);
  for (int64_t i = 0; i < n_ * hidden_; ++i) out.data()[i] = Bf16ToFloat(host_out_.data()[i]);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StagedCudaExpertBackend>> StagedCudaExpertBackend::Create(
    const ModelConfig& config, const ExpertWeightSource& experts, int device,
    CudaExpertOptions options) {
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", device, " does not exist (", CudaDeviceCount(), " CUDA devices)"));
  }
  std::unique_ptr<StagedCudaExpertBackend> b(new StagedCudaExpertBackend());
  ASSIGN_OR_RETURN(b->context_, CudaContext::Create({.device = device}));
  ASSIGN_OR_RETURN(b->staging_,
                   HostExpertStaging::Create(options.max_tokens, config.top_k, config.hidden_size));
  ASSIGN_OR_RETURN(b->experts_,
                   CudaExpertBackend::Create(config, experts, b->context_.get(), options));
  return b;
}

absl::Status StagedCudaExpertBackend::RunExperts(int layer, const Tensor& x,
                                                 const RoutingTable& routing, Tensor& out) {
  cudaStream_t stream = context_->stream();
  RETURN_IF_ERROR(staging_.Upload(x, routing, stream));
  Tensor device_out;
  RETURN_IF_ERROR(
      experts_->RunExperts(layer, staging_.device_x(), staging_.device_routing(), device_out));
  return staging_.Download(static_cast<const bf16*>(device_out.device_data()), stream, out);
}

}  // namespace strata::gpu
