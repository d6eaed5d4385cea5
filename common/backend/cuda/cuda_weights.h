// Uploading a model's weights to the device in the layouts the kernels read: row-major bf16
// matrices (repacked from any stored layout), bf16 vectors, and a one-expert table for dense
// FFNs so that they run through the grouped-expert kernels too.
#ifndef STRATA_COMMON_BACKEND_CUDA_CUDA_WEIGHTS_H_
#define STRATA_COMMON_BACKEND_CUDA_CUDA_WEIGHTS_H_

#include <array>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/cuda_types.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kernels/grouped_expert_kernels.h"
#include "common/model/model_weights.h"

namespace strata::gpu {

// Owns every allocation it hands out.
class DeviceWeightStore {
 public:
  explicit DeviceWeightStore(cudaStream_t stream) : stream_(stream) {}

  // A row-major copy of `w` (with `bias` if present): bf16, or FP8 E4M3 with per-row scales
  // (a row-major FP8 matrix's own codes and scales; any other quantized on the device from its
  // bf16 values, round to nearest).
  absl::StatusOr<DeviceWeight> Matrix(const WeightMatrix& w, const WeightVector& bias = {},
                                      WeightFormat format = WeightFormat::kBf16);
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

// The format a --weights value names: "fp8" is FP8 E4M3, anything else (callers have checked
// for "bf16") bf16.
inline WeightFormat WeightFormatNamed(std::string_view weights) {
  return weights == "fp8" ? WeightFormat::kFp8E4M3 : WeightFormat::kBf16;
}

// Whether a matrix is already row-major bf16 [out, in], so its bytes can be copied as they are.
inline bool IsRowMajorBf16(const WeightMatrix& w) {
  return w.dtype == DType::kBF16 && w.row_major();
}

// Where one routed expert's weights sit in a block of device memory: gate, up and down, then
// (FP8) their per-row scales, then (biased models) their biases, each 256-byte aligned. Every
// expert of CudaExpertBackend and every GPU expert slot uses this layout.
struct ExpertDeviceLayout {
  WeightFormat format = WeightFormat::kBf16;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  bool biased = false;
  size_t matrix_bytes = 0;  // one matrix, padded
  size_t scales_offset = 0;
  size_t biases_offset = 0;
  size_t bytes = 0;  // the whole expert

  static ExpertDeviceLayout For(int64_t hidden, int64_t intermediate, WeightFormat format,
                                bool biased);
  // The expert's 9 table entries: gate, up, down, their 3 scales and 3 biases (null where the
  // format or the weights have none).
  std::array<const void*, 9> Pointers(const uint8_t* base, const FfnWeights& weights) const;
  // InvalidArgument unless `weights` has this layout's shapes (biases only when biased).
  absl::Status Check(const FfnWeights& weights) const;
  // Host bf16 elements EnqueueExpertUpload may stage (every matrix repacked, the biases).
  size_t host_staging_elements() const;
};

// Queues on `stream` the copy of `weights` into the expert at `base`. Matrices already in
// row-major bf16 are copied from where they are (truly asynchronous when that memory is pinned
// or registered); others are repacked on the host first into `host_staging` (pinned,
// host_staging_elements() long; not touched when nothing needs repacking), as are biases. FP8
// matrices pass through `device_staging` (one bf16 matrix) and are quantized on `stream`. The
// caller keeps the sources and the staging untouched until `stream` is past the copies.
// Sets `*used_host_staging` (may be null) to whether host_staging was written.
absl::Status EnqueueExpertUpload(const FfnWeights& weights, const ExpertDeviceLayout& layout,
                                 uint8_t* base, uint16_t* host_staging, bf16* device_staging,
                                 cudaStream_t stream, bool* used_host_staging = nullptr);

// The table over `device_pointers`: 9 arrays of `num_experts` entries in Pointers() order.
ExpertWeightTable ExpertTableOver(const ExpertDeviceLayout& layout, int num_experts,
                                  const void* const* device_pointers);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_CUDA_WEIGHTS_H_
