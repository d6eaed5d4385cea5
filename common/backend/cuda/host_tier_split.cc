#include "common/backend/cuda/host_tier_split.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/kernels/elementwise_kernels.h"
#include "common/util/status_macros.h"

namespace strata::gpu {

absl::StatusOr<std::unique_ptr<HostTierSplit>> HostTierSplit::Create(int max_tokens, int top_k,
                                                                     int64_t hidden,
                                                                     int num_experts) {
  if (max_tokens <= 0 || top_k <= 0 || hidden <= 0 || num_experts <= 0) {
    return absl::InvalidArgumentError("host tier split: empty shape");
  }
  auto split = std::unique_ptr<HostTierSplit>(new HostTierSplit(hidden, num_experts));
  const size_t rows = static_cast<size_t>(max_tokens);
  const size_t slots = rows * static_cast<size_t>(top_k);
  ASSIGN_OR_RETURN(split->x_host_, PinnedBuffer<bf16>::Allocate(rows * hidden));
  ASSIGN_OR_RETURN(split->weights_host_, PinnedBuffer<float>::Allocate(slots));
  ASSIGN_OR_RETURN(split->device_ids_host_, PinnedBuffer<int32_t>::Allocate(slots));
  ASSIGN_OR_RETURN(split->device_ids_, DeviceBuffer<int32_t>::Allocate(slots));
  ASSIGN_OR_RETURN(split->sums_host_, PinnedBuffer<float>::Allocate(rows * hidden));
  ASSIGN_OR_RETURN(split->sums_, DeviceBuffer<float>::Allocate(rows * hidden));
  return split;
}

absl::StatusOr<const int32_t*> HostTierSplit::Begin(int layer, absl::Span<const int32_t> ids,
                                                    absl::Span<const int> host_experts,
                                                    const bf16* x, const float* weights, int64_t n,
                                                    int top_k, HostExpertTier& tier,
                                                    cudaStream_t stream) {
  const size_t slots = static_cast<size_t>(n) * top_k;
  if (ids.size() != slots || slots > device_ids_.size() ||
      static_cast<size_t>(n * hidden_) > x_host_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host tier split: ", n, " tokens x ", top_k, " do not fit"));
  }
  for (int e : host_experts) on_host_[e] = 1;
  host_ids_.assign(slots, -1);
  for (size_t i = 0; i < slots; ++i) {
    const int32_t e = ids[i];
    const bool host = e >= 0 && static_cast<size_t>(e) < on_host_.size() && on_host_[e];
    device_ids_host_.data()[i] = host ? -1 : e;
    if (host) host_ids_[i] = e;
  }
  for (int e : host_experts) on_host_[e] = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x_host_.data(), x, n * hidden_ * sizeof(bf16),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(weights_host_.data(), weights, slots * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_ids_.data(), device_ids_host_.data(),
                                       slots * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  // Also leaves the last step's sums read (Finish reuses sums_host_).
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  x_float_.resize(static_cast<size_t>(n * hidden_));
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x_host_.data());
  cpu::Bf16RowToFloat(bits, n * hidden_, x_float_.data());  // a prefill's rows are megabytes
  RETURN_IF_ERROR(tier.Submit(layer, n, top_k, x_float_, host_ids_,
                              absl::MakeConstSpan(weights_host_.data(), slots)));
  return device_ids_.data();
}

absl::Status HostTierSplit::Finish(bf16* out, int64_t n, HostExpertTier& tier,
                                   cudaStream_t stream) {
  RETURN_IF_ERROR(tier.Collect(partial_));
  const size_t count = static_cast<size_t>(n * hidden_);
  if (static_cast<size_t>(partial_.size()) != count) {
    return absl::DataLossError(absl::StrCat("host tier: ", partial_.size(), " sums for ", count));
  }
  std::memcpy(sums_host_.data(), partial_.data(), count * sizeof(float));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sums_.data(), sums_host_.data(), count * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(LaunchAddFloat(out, sums_.data(), static_cast<int64_t>(count), stream));
  return absl::OkStatus();
}

}  // namespace strata::gpu
