// Activations: a 2-D row-major buffer [rows, cols]. Host tensors are float32 and owned here;
// device tensors are views of memory a device backend owns (their element type is the
// backend's, e.g. bf16), passed through the backend-neutral forward pass.
#ifndef STRATA_COMMON_TENSOR_TENSOR_H_
#define STRATA_COMMON_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>

namespace strata {

enum class Device { kCpu, kCuda };

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled host tensor.
  static Tensor Host(int64_t rows, int64_t cols);
  // A view of device memory; `keep_alive` (may be null) holds the memory while the view lives.
  static Tensor DeviceView(void* data, int64_t rows, int64_t cols,
                           std::shared_ptr<void> keep_alive = nullptr);

  Device device() const { return device_; }
  // The device pointer of a device tensor.
  void* device_data() const { return device_data_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  float* row(int64_t r) { return data_.get() + r * cols_; }
  const float* row(int64_t r) const { return data_.get() + r * cols_; }

  // Changes the shape, reallocating only when the capacity is too small. Contents are
  // unspecified afterwards.
  void Resize(int64_t rows, int64_t cols);
  void SetZero();

 private:
  Device device_ = Device::kCpu;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t capacity_ = 0;
  std::shared_ptr<float[]> data_;
  void* device_data_ = nullptr;
  std::shared_ptr<void> keep_alive_;
};

}  // namespace strata

#endif  // STRATA_COMMON_TENSOR_TENSOR_H_
