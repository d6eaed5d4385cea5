// Uploading a model's weights to the device in the layouts the kernels read: row-major bf16
// matrices (repacked from any stored layout), bf16 vectors, and a one-expert table for dense
// FFNs so that they run through the grouped-expert kernels too.
#ifndef STRATA_COMMON_BACKEND_CUDA_CUDA_WEIGHTS_H_
#define STRATA_COMMON_BACKEND_CUDA_CUDA_WEIGHTS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/cuda/cuda_types.h"
#include "common/backend/cuda/device_buffer.h"
#include "common/backend/cuda/grouped_expert_kernels.h"
#include "common/model/model_weights.h"

namespace strata::gpu {

// Owns every allocation it hands out.
class DeviceWeightStore {
 public:
  explicit DeviceWeightStore(cudaStream_t stream) : stream_(stream) {}

  // A bf16 row-major copy of `w` (with `bias` if present).
  absl::StatusOr<DeviceWeight> Matrix(const WeightMatrix& w, const WeightVector& bias = {});
  // A bf16 copy of `v`; null when absent.
  absl::StatusOr<const bf16*> Vector(const WeightVector& v);
  // A float32 copy of `v`; null when absent.
  absl::StatusOr<const float*> FloatVector(const WeightVector& v);
  // Device memory for `count` elements of T, owned by the store.
  template <typename T>
  absl::StatusOr<T*> Allocate(size_t count) {
    auto buffer = DeviceBuffer<uint8_t>::Allocate(count * sizeof(T));
    if (!buffer.ok()) return buffer.status();
    T* ptr = reinterpret_cast<T*>(buffer->data());
    buffers_.push_back(*std::move(buffer));
    return ptr;
  }
  // A device copy of host[0, count).
  template <typename T>
  absl::StatusOr<T*> Upload(const T* host, size_t count) {
    auto ptr = Allocate<T>(count);
    if (!ptr.ok()) return ptr.status();
    if (count > 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(*ptr, host, count * sizeof(T), cudaMemcpyHostToDevice, stream_));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return *ptr;
  }
  // A single-expert table for a dense SwiGLU FFN (gate, up, down, optional biases).
  absl::StatusOr<ExpertWeightTable> SingleExpert(const FfnWeights& ffn);

 private:
  cudaStream_t stream_;
  std::vector<DeviceBuffer<uint8_t>> buffers_;
};

// Whether a matrix is already row-major bf16 [out, in], so its bytes can be copied as they are.
inline bool IsRowMajorBf16(const WeightMatrix& w) {
  return w.dtype == DType::kBF16 && w.in_stride == 1 && w.out_stride == w.in;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_CUDA_WEIGHTS_H_
