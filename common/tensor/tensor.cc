#include "common/tensor/tensor.h"

#include <algorithm>

namespace strata {

Tensor Tensor::Host(int64_t rows, int64_t cols) {
  Tensor t;
  t.Resize(rows, cols);
  t.SetZero();
  return t;
}

Tensor Tensor::DeviceView(void* data, int64_t rows, int64_t cols,
                          std::shared_ptr<void> keep_alive) {
  Tensor t;
  t.device_ = Device::kCuda;
  t.rows_ = rows;
  t.cols_ = cols;
  t.device_data_ = data;
  t.keep_alive_ = std::move(keep_alive);
  return t;
}

void Tensor::Resize(int64_t rows, int64_t cols) {
  if (device_ != Device::kCpu) {  // a view goes back to being an owned host tensor
    *this = Tensor();
  }
  const int64_t needed = rows * cols;
  if (needed > capacity_ || data_ == nullptr) {
    data_ = std::shared_ptr<float[]>(new float[std::max<int64_t>(needed, 1)]);
    capacity_ = needed;
  }
  rows_ = rows;
  cols_ = cols;
}

void Tensor::SetZero() { std::fill(data_.get(), data_.get() + size(), 0.0f); }

}  // namespace strata
