#include "common/backend/cuda/expert_repack.h"

#include <algorithm>

#include "common/tensor/dtype.h"

namespace strata::gpu {
namespace {

constexpr int64_t kTile = 64;

}  // namespace

void RepackToRowMajorBf16(const WeightMatrix& w, uint16_t* dst) {
  if (w.dtype == DType::kBF16 && w.row_major()) {
    const uint16_t* src = static_cast<const uint16_t*>(w.data);
    std::copy(src, src + w.out * w.in, dst);
    return;
  }
  const bool bf16 = w.dtype == DType::kBF16;
  const uint16_t* raw = static_cast<const uint16_t*>(w.data);
  for (int64_t o0 = 0; o0 < w.out; o0 += kTile) {
    const int64_t o1 = std::min(w.out, o0 + kTile);
    for (int64_t i0 = 0; i0 < w.in; i0 += kTile) {
      const int64_t i1 = std::min(w.in, i0 + kTile);
      for (int64_t o = o0; o < o1; ++o) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t src = o * w.out_stride + i * w.in_stride;
          dst[o * w.in + i] = bf16 ? raw[src] : FloatToBf16(w.At(o, i));
        }
      }
    }
  }
}

std::vector<uint16_t> RepackToRowMajorBf16(const WeightMatrix& w) {
  std::vector<uint16_t> out(static_cast<size_t>(w.out * w.in));
  RepackToRowMajorBf16(w, out.data());
  return out;
}

std::vector<uint16_t> RepackVectorBf16(const WeightVector& v) {
  std::vector<uint16_t> out;
  if (!v.present()) return out;
  out.resize(static_cast<size_t>(v.size));
  for (int64_t j = 0; j < v.size; ++j) {
    const int64_t src = j * v.stride;
    out[j] = v.dtype == DType::kBF16 ? static_cast<const uint16_t*>(v.data)[src]
                                     : FloatToBf16(LoadAsFloat(v.data, v.dtype, src));
  }
  return out;
}

}  // namespace strata::gpu
