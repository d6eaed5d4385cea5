// DeviceBuffer<T>: an owned cudaMalloc allocation of `size` elements, freed on destruction.
#ifndef STRATA_COMMON_CUDA_DEVICE_BUFFER_H_
#define STRATA_COMMON_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/cuda_status.h"

namespace strata::gpu {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  // Uninitialized memory for `size` elements (no allocation for 0).
  static absl::StatusOr<DeviceBuffer> Allocate(size_t size) {
    DeviceBuffer buffer;
    if (size > 0) {
      void* ptr = nullptr;
      CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, size * sizeof(T)));
      buffer.data_ = static_cast<T*>(ptr);
      buffer.size_ = size;
    }
    return buffer;
  }

  // A buffer holding a copy of host[0, size), complete with respect to `stream` on return.
  static absl::StatusOr<DeviceBuffer> FromHost(const T* host, size_t size,
                                               cudaStream_t stream = nullptr) {
    absl::StatusOr<DeviceBuffer> buffer = Allocate(size);
    if (!buffer.ok()) return buffer.status();
    absl::Status copied = buffer->CopyFromHost(host, size, stream);
    if (!copied.ok()) return copied;
    return buffer;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  // Copies of the first `count` elements (count <= size()), queued on `stream` and waited for,
  // so they are ordered with kernels on that stream even when it is a non-blocking stream
  // (a plain cudaMemcpy on the legacy stream is not, and may still be in flight on return).
  absl::Status CopyFromHost(const T* host, size_t count, cudaStream_t stream = nullptr) {
    if (count > size_) return absl::InvalidArgumentError("DeviceBuffer: copy larger than buffer");
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(data_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(T* host, size_t count, cudaStream_t stream = nullptr) const {
    if (count > size_) return absl::InvalidArgumentError("DeviceBuffer: copy larger than buffer");
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }
  // Sets every byte to `byte` (0xff poisons float and bf16 buffers with NaN), on `stream`.
  absl::Status FillBytes(int byte, cudaStream_t stream = nullptr) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data_, byte, bytes(), stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }

  void Reset() {
    if (data_ != nullptr) cudaFree(data_);  // best effort: a destructor cannot report
    data_ = nullptr;
    size_ = 0;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

// PinnedBuffer<T>: page-locked host memory (cudaHostAlloc), so asynchronous copies from it
// need no staging and can be captured in a CUDA graph (the graph reads it at replay).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  static absl::StatusOr<PinnedBuffer> Allocate(size_t size) {
    PinnedBuffer buffer;
    void* ptr = nullptr;
    CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&ptr, std::max<size_t>(size, 1) * sizeof(T), cudaHostAllocDefault));
    buffer.data_ = static_cast<T*>(ptr);
    buffer.size_ = size;
    return buffer;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_DEVICE_BUFFER_H_
