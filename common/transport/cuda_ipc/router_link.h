// The router's end of one TRANSPORT_CUDA_IPC link (link_views.h): the worker's routing, output,
// flags and interprocess events on the router's GPU, and the handles that share them. CUDA
// builds only.
#ifndef STRATA_COMMON_TRANSPORT_CUDA_IPC_ROUTER_LINK_H_
#define STRATA_COMMON_TRANSPORT_CUDA_IPC_ROUTER_LINK_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "common/cuda/cuda_types.h"
#include "common/cuda/device_buffer.h"
#include "common/transport/cuda_ipc/link_views.h"
#include "strata/v1/cluster.pb.h"

namespace strata::cuda_ipc {

// Device memory another process may open: whole multiples of 2 MiB, since smaller allocations
// may be carved from a larger block, which a handle would share whole (and map from its start).
template <typename T>
absl::StatusOr<gpu::DeviceBuffer<T>> AllocateShared(size_t count) {
  constexpr size_t kGranule = size_t{2} << 20;
  const size_t bytes = (count * sizeof(T) + kGranule - 1) / kGranule * kGranule;
  return gpu::DeviceBuffer<T>::Allocate(bytes / sizeof(T));
}

struct LinkShape {
  int device = 0;  // the router's GPU
  uint32_t max_tokens = 0;
  uint32_t top_k = 0;
  uint32_t hidden_size = 0;
  uint32_t num_layers = 0;
  bool device_scope_flags = false;  // the worker runs on the router's GPU
};

class RouterLink {
 public:
  // Allocates the link on shape.device (current on the calling thread), its flags zeroed on
  // `stream` and waited for.
  static absl::StatusOr<std::unique_ptr<RouterLink>> Create(const LinkShape& shape,
                                                            cudaStream_t stream);
  ~RouterLink();
  RouterLink(const RouterLink&) = delete;
  RouterLink& operator=(const RouterLink&) = delete;

  // The handles of the link's buffers and events, with those of `shared_input` (the input every
  // worker reads, from AllocateShared), for the worker to open (OpenWorkerLink).
  absl::Status Export(void* shared_input, v1::CudaIpcBuffers& buffers) const;
  // The same as pointers of this process (AttachWorkerLink, in one process).
  LinkViews views(void* shared_input) const;

  const LinkShape& shape() const { return shape_; }
  int32_t* ids() { return ids_.data(); }
  float* weights() { return weights_.data(); }
  gpu::bf16* output() { return output_.data(); }
  uint32_t* flags() { return flags_.data(); }
  uint32_t* input_flag(int layer) { return flags_.data() + InputFlag(layer); }
  uint32_t* output_flag(int layer) {
    return flags_.data() + OutputFlag(static_cast<int>(shape_.num_layers), layer);
  }
  cudaEvent_t input_ready() const { return input_ready_; }
  cudaEvent_t output_ready() const { return output_ready_; }

 private:
  explicit RouterLink(const LinkShape& shape) : shape_(shape) {}

  LinkShape shape_;
  gpu::DeviceBuffer<int32_t> ids_;
  gpu::DeviceBuffer<float> weights_;
  gpu::DeviceBuffer<gpu::bf16> output_;
  gpu::DeviceBuffer<uint32_t> flags_;
  cudaEvent_t input_ready_ = nullptr;
  cudaEvent_t output_ready_ = nullptr;
};

}  // namespace strata::cuda_ipc

#endif  // STRATA_COMMON_TRANSPORT_CUDA_IPC_ROUTER_LINK_H_
