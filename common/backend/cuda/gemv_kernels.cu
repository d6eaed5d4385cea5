#include "common/backend/cuda/gemv_core.cuh"
#include "common/backend/cuda/gemv_kernels.h"

namespace strata::gpu {
namespace {

// Rows per thread group: more rows give more independent loads in flight, fewer leave
// registers for more tokens.
template <int kNT>
inline constexpr int kRowsFor = kNT <= 4 ? 4 : 2;

template <typename WT, int kE, int kNT, typename OutT>
__global__ void __launch_bounds__(kGemvThreads, 2)
    GemvKernel(const WT* __restrict__ w, const float* __restrict__ scale,
               const bf16* __restrict__ bias, int64_t out_dim, int64_t in_dim,
               const bf16* __restrict__ x, int64_t x_stride, int n, OutT* __restrict__ y,
               int64_t y_stride, int num_parts) {
  constexpr int kRows = kRowsFor<kNT>;
  __shared__ float red[kGemvThreads / kWarpSize * kRows * kNT];
  const int groups = kGemvThreads / num_parts;
  const int64_t row0 = (int64_t{blockIdx.x} * groups + threadIdx.x / num_parts) * kRows;
  const WT* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = w + min(row0 + r, out_dim - 1) * in_dim;
  const bf16* xr[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) xr[t] = x + min(t, n - 1) * x_stride;
  float acc[kRows][kNT];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[r][t] = 0.0f;
  }
  AccumulateDots<WT, kE, kRows, kNT>(wr, xr, n, in_dim, threadIdx.x % num_parts, num_parts, acc);
  GroupReduce<kRows, kNT>(acc, num_parts, red, [&](int r, int t, float v) {
    const int64_t row = row0 + r;
    if (row >= out_dim || t >= n) return;
    if (scale != nullptr) v *= scale[row];
    if (bias != nullptr) v += __bfloat162float(bias[row]);
    StoreOut(y + t * y_stride + row, v);
  });
}

template <typename WT, int kE, int kNT, typename OutT>
cudaError_t LaunchTyped(const DeviceWeight& w, const bf16* x, int64_t x_stride, int n, OutT* y,
                        int64_t y_stride, cudaStream_t stream) {
  constexpr int kRows = kRowsFor<kNT>;
  const int64_t row_groups = (w.out + kRows - 1) / kRows;
  const int parts = GemvPartsFor(w.in / kE, row_groups);
  const int64_t blocks = (row_groups + kGemvThreads / parts - 1) / (kGemvThreads / parts);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  GemvKernel<WT, kE, kNT, OutT><<<static_cast<unsigned>(blocks), kGemvThreads, 0, stream>>>(
      static_cast<const WT*>(w.data), w.format == WeightFormat::kFp8E4M3 ? w.scale : nullptr,
      w.bias, w.out, w.in, x, x_stride, n, y, y_stride, parts);
  return cudaGetLastError();
}

template <typename WT, typename OutT>
cudaError_t LaunchForWeight(const DeviceWeight& w, const bf16* x, int64_t x_stride, int n, OutT* y,
                            int64_t y_stride, cudaStream_t stream) {
  constexpr int kE = kVecElems<WT>;
  const bool vec = w.in % kE == 0 && x_stride % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (!vec) return LaunchTyped<WT, 1, kGemvMaxTokens>(w, x, x_stride, n, y, y_stride, stream);
  if (n == 1) return LaunchTyped<WT, kE, 1>(w, x, x_stride, n, y, y_stride, stream);
  if (n == 2) return LaunchTyped<WT, kE, 2>(w, x, x_stride, n, y, y_stride, stream);
  if (n <= 4) return LaunchTyped<WT, kE, 4>(w, x, x_stride, n, y, y_stride, stream);
  if (n <= 8) return LaunchTyped<WT, kE, 8>(w, x, x_stride, n, y, y_stride, stream);
  return LaunchTyped<WT, kE, 16>(w, x, x_stride, n, y, y_stride, stream);
}

}  // namespace

cudaError_t LaunchGemv(const DeviceWeight& w, const bf16* x, int64_t x_stride, int64_t n, void* y,
                       OutType y_type, int64_t y_stride, cudaStream_t stream) {
  if (w.data == nullptr || w.out <= 0 || w.in <= 0 || n < 0 ||
      (w.format == WeightFormat::kFp8E4M3 && w.scale == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const size_t out_size = y_type == OutType::kBf16 ? sizeof(bf16) : sizeof(float);
  for (int64_t t0 = 0; t0 < n; t0 += kGemvMaxTokens) {
    const int chunk = static_cast<int>(n - t0 < kGemvMaxTokens ? n - t0 : kGemvMaxTokens);
    const bf16* xc = x + t0 * x_stride;
    void* yc = static_cast<char*>(y) + t0 * y_stride * out_size;
    cudaError_t err;
    if (w.format == WeightFormat::kBf16) {
      err = y_type == OutType::kBf16
                ? LaunchForWeight<bf16>(w, xc, x_stride, chunk, static_cast<bf16*>(yc), y_stride,
                                        stream)
                : LaunchForWeight<bf16>(w, xc, x_stride, chunk, static_cast<float*>(yc), y_stride,
                                        stream);
    } else {
      err = y_type == OutType::kBf16
                ? LaunchForWeight<uint8_t>(w, xc, x_stride, chunk, static_cast<bf16*>(yc), y_stride,
                                           stream)
                : LaunchForWeight<uint8_t>(w, xc, x_stride, chunk, static_cast<float*>(yc),
                                           y_stride, stream);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace strata::gpu
