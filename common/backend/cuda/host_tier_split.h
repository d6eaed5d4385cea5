// One eager layer step whose experts are shared between the device and a host tier
// (strata-expert-store's CPU tier): the routing is split in two, the host tier's share goes out
// with the step's activations while the device runs the rest, and the host's weighted sums are
// added into the device's output before the step's output is handed back.
//
//   ASSIGN_OR_RETURN(const int32_t* device_ids, split.Begin(...));   // host tier starts
//   ... launch the device's experts with device_ids into out ...
//   RETURN_IF_ERROR(split.Finish(out, n, stream));                   // out += host's sums
#ifndef STRATA_COMMON_BACKEND_CUDA_HOST_TIER_SPLIT_H_
#define STRATA_COMMON_BACKEND_CUDA_HOST_TIER_SPLIT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/backend/expert_slots.h"
#include "common/cuda/cuda_types.h"
#include "common/cuda/device_buffer.h"
#include "common/tensor/tensor.h"

namespace strata::gpu {

class HostTierSplit {
 public:
  // Buffers for steps of up to max_tokens x top_k, over experts [0, num_experts).
  static absl::StatusOr<std::unique_ptr<HostTierSplit>> Create(int max_tokens, int top_k,
                                                               int64_t hidden, int num_experts);

  // `ids` is the step's routing already on the host ([n, top_k]); `host_experts` the experts
  // the host tier computes. With the stream ordered after whatever wrote x and
  // weights (device, [n, hidden] bf16 and [n, top_k]): reads them back (synchronizing the
  // stream), submits the host tier's share to `tier`, and returns the device copy of the
  // routing with those slots -1, for the device's launch on the same stream. An error from
  // the tier is returned as is (nothing is outstanding then).
  absl::StatusOr<const int32_t*> Begin(int layer, absl::Span<const int32_t> ids,
                                       absl::Span<const int> host_experts, const bf16* x,
                                       const float* weights, int64_t n, int top_k,
                                       HostExpertTier& tier, cudaStream_t stream);
  // Waits for the host tier's sums and queues out[n, hidden] += them on `stream`. An error
  // from the tier is returned as is: `out` then holds the device's share only.
  absl::Status Finish(bf16* out, int64_t n, HostExpertTier& tier, cudaStream_t stream);

 private:
  HostTierSplit(int64_t hidden, int num_experts)
      : hidden_(hidden), on_host_(static_cast<size_t>(num_experts), 0) {}

  const int64_t hidden_;
  PinnedBuffer<bf16> x_host_;
  PinnedBuffer<float> weights_host_;
  PinnedBuffer<int32_t> device_ids_host_;
  DeviceBuffer<int32_t> device_ids_;
  PinnedBuffer<float> sums_host_;
  DeviceBuffer<float> sums_;
  std::vector<char> on_host_;  // by expert id: the host tier's, during Begin only
  std::vector<float> x_float_;
  std::vector<int32_t> host_ids_;
  Tensor partial_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_HOST_TIER_SPLIT_H_
