#include "common/transport/cuda_ipc/router_link.h"

#include <string>

#include "common/cuda/cuda_status.h"
#include "common/util/status_macros.h"

namespace strata::cuda_ipc {
namespace {

constexpr unsigned kEventFlags = cudaEventInterprocess | cudaEventDisableTiming;

absl::Status PutMemHandle(const void* device_ptr, std::string* out) {
  cudaIpcMemHandle_t handle;
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, const_cast<void*>(device_ptr)));
  out->assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return absl::OkStatus();
}

absl::Status PutEventHandle(cudaEvent_t event, std::string* out) {
  cudaIpcEventHandle_t handle;
  CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&handle, event));
  out->assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RouterLink>> RouterLink::Create(const LinkShape& shape,
                                                               cudaStream_t stream) {
  if (shape.max_tokens == 0 || shape.top_k == 0 || shape.hidden_size == 0 ||
      shape.num_layers == 0) {
    return absl::InvalidArgumentError("CUDA IPC link: empty shape");
  }
  std::unique_ptr<RouterLink> link(new RouterLink(shape));
  const size_t slots = size_t{shape.max_tokens} * shape.top_k;
  ASSIGN_OR_RETURN(link->ids_, AllocateShared<int32_t>(slots));
  ASSIGN_OR_RETURN(link->weights_, AllocateShared<float>(slots));
  ASSIGN_OR_RETURN(link->output_,
                   AllocateShared<gpu::bf16>(size_t{shape.max_tokens} * shape.hidden_size));
  const size_t flags = 2 * size_t{shape.num_layers};
  ASSIGN_OR_RETURN(link->flags_, AllocateShared<uint32_t>(flags));
  // On the caller's stream: the legacy stream would wait for others (perhaps capturing).
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(link->flags_.data(), 0, flags * sizeof(uint32_t), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&link->input_ready_, kEventFlags));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&link->output_ready_, kEventFlags));
  return link;
}

RouterLink::~RouterLink() {
  // Best effort, on whichever thread drops the last reference.
  cudaSetDevice(shape_.device);
  if (input_ready_ != nullptr) cudaEventDestroy(input_ready_);
  if (output_ready_ != nullptr) cudaEventDestroy(output_ready_);
}

absl::Status RouterLink::Export(void* shared_input, v1::CudaIpcBuffers& buffers) const {
  buffers.set_device(shape_.device);
  buffers.set_max_tokens(shape_.max_tokens);
  buffers.set_top_k(shape_.top_k);
  buffers.set_hidden_size(shape_.hidden_size);
  buffers.set_num_layers(shape_.num_layers);
  buffers.set_device_scope_flags(shape_.device_scope_flags);
  RETURN_IF_ERROR(PutMemHandle(shared_input, buffers.mutable_input()));
  RETURN_IF_ERROR(PutMemHandle(ids_.data(), buffers.mutable_expert_ids()));
  RETURN_IF_ERROR(PutMemHandle(weights_.data(), buffers.mutable_expert_weights()));
  RETURN_IF_ERROR(PutMemHandle(output_.data(), buffers.mutable_output()));
  RETURN_IF_ERROR(PutMemHandle(flags_.data(), buffers.mutable_flags()));
  RETURN_IF_ERROR(PutEventHandle(input_ready_, buffers.mutable_input_ready()));
  RETURN_IF_ERROR(PutEventHandle(output_ready_, buffers.mutable_output_ready()));
  return absl::OkStatus();
}

LinkViews RouterLink::views(void* shared_input) const {
  LinkViews v;
  v.device = shape_.device;
  v.max_tokens = shape_.max_tokens;
  v.top_k = shape_.top_k;
  v.hidden_size = shape_.hidden_size;
  v.num_layers = shape_.num_layers;
  v.input = shared_input;
  v.ids = const_cast<int32_t*>(ids_.data());
  v.weights = const_cast<float*>(weights_.data());
  v.output = const_cast<gpu::bf16*>(output_.data());
  v.flags = const_cast<uint32_t*>(flags_.data());
  v.input_ready = input_ready_;
  v.output_ready = output_ready_;
  v.device_scope_flags = shape_.device_scope_flags;
  return v;
}

}  // namespace strata::cuda_ipc
