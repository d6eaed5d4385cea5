#include "common/cuda/device_utils.cuh"
#include "common/cuda/kernels/rope_kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 128;        // 4 warps, one (token, head) each
constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256: half <= 128 = 4 * 32

// The (token, head) of this warp: its head vector, norm weight and token, or x null past the
// end.
struct WarpHead {
  bf16* x = nullptr;
  const bf16* norm = nullptr;
  int64_t t = 0;
};

__device__ __forceinline__ WarpHead WarpHeadOf(bf16* q, bf16* k, int64_t n, const QkRopeParams& p) {
  const int64_t item = int64_t{blockIdx.x} * (kThreads / kWarpSize) + threadIdx.x / kWarpSize;
  const int heads_per_token = p.num_heads + p.num_kv_heads;
  WarpHead w;
  if (item >= n * heads_per_token) return w;
  w.t = item / heads_per_token;
  const int head = static_cast<int>(item % heads_per_token);
  const bool is_q = head < p.num_heads;
  w.x = is_q ? q + w.t * p.q_stride + int64_t{head} * p.head_dim
             : k + w.t * p.k_stride + int64_t{head - p.num_heads} * p.head_dim;
  w.norm = is_q ? p.q_norm : p.k_norm;
  return w;
}

// One warp per (token, head): lane l holds the pairs (j, j + half) for j = l + 32 p, so the
// rotation needs no exchange between lanes and the norm only one warp reduction.
__global__ void __launch_bounds__(kThreads)
    QkNormRopeKernel(bf16* q, bf16* k, int64_t n, const int32_t* __restrict__ positions,
                     QkRopeParams p) {
  const int lane = threadIdx.x % kWarpSize;
  const WarpHead w = WarpHeadOf(q, k, n, p);
  if (w.x == nullptr) return;
  bf16* x = w.x;
  const bf16* norm = w.norm;
  const int64_t t = w.t;
  const int half = p.head_dim / 2;

  float a[kMaxPairsPerLane], b[kMaxPairsPerLane];
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPairsPerLane; ++i) {
    const int j = lane + i * kWarpSize;
    a[i] = j < half ? __bfloat162float(x[j]) : 0.0f;
    b[i] = j < half ? __bfloat162float(x[j + half]) : 0.0f;
    sum_sq += a[i] * a[i] + b[i] * b[i];
  }
  if (norm != nullptr) {
    sum_sq = WarpSum(sum_sq);
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(p.head_dim) + p.eps);
#pragma unroll
    for (int i = 0; i < kMaxPairsPerLane; ++i) {
      const int j = lane + i * kWarpSize;
      if (j < half) {
        a[i] = __bfloat162float(norm[j]) * (a[i] * inv);
        b[i] = __bfloat162float(norm[j + half]) * (b[i] * inv);
      }
    }
  }
  // Same float32 angle as the CPU reference; accurate sincosf (not the fast intrinsic), since
  // angles reach position * 1 radian and need full range reduction.
  const float pos = static_cast<float>(positions[t]);
#pragma unroll
  for (int i = 0; i < kMaxPairsPerLane; ++i) {
    const int j = lane + i * kWarpSize;
    if (j < half) {
      const float angle = pos * p.inv_freq[j];
      float s, c;
      sincosf(angle, &s, &c);
      c *= p.attention_scaling;
      s *= p.attention_scaling;
      x[j] = __float2bfloat16(a[i] * c - b[i] * s);
      x[j + half] = __float2bfloat16(b[i] * c + a[i] * s);
    }
  }
}

// Partial rotary (rope_dim < head_dim): the pairs (j, j + rope_dim / 2) fall in other lanes'
// registers, so the warp stages its head in shared memory. The rest of the head is only
// normalized.
__global__ void __launch_bounds__(kThreads)
    QkNormPartialRopeKernel(bf16* q, bf16* k, int64_t n, const int32_t* __restrict__ positions,
                            QkRopeParams p) {
  __shared__ float staged[kThreads / kWarpSize][2 * kMaxPairsPerLane * kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const WarpHead w = WarpHeadOf(q, k, n, p);
  if (w.x == nullptr) return;
  bf16* x = w.x;
  float* h = staged[threadIdx.x / kWarpSize];
  float sum_sq = 0.0f;
  for (int j = lane; j < p.head_dim; j += kWarpSize) {
    h[j] = __bfloat162float(x[j]);
    sum_sq += h[j] * h[j];
  }
  if (w.norm != nullptr) {
    sum_sq = WarpSum(sum_sq);
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(p.head_dim) + p.eps);
    for (int j = lane; j < p.head_dim; j += kWarpSize) {
      h[j] = __bfloat162float(w.norm[j]) * (h[j] * inv);
    }
  }
  __syncwarp();
  const int half = p.rope_dim / 2;
  const float pos = static_cast<float>(positions[w.t]);
  for (int j = lane; j < half; j += kWarpSize) {
    float s, c;
    sincosf(pos * p.inv_freq[j], &s, &c);
    c *= p.attention_scaling;
    s *= p.attention_scaling;
    const float a = h[j], b = h[j + half];
    h[j] = a * c - b * s;
    h[j + half] = b * c + a * s;
  }
  __syncwarp();
  for (int j = lane; j < p.head_dim; j += kWarpSize) x[j] = __float2bfloat16(h[j]);
}

}  // namespace

cudaError_t LaunchQkNormRope(bf16* q, bf16* k, int64_t n, const int32_t* positions,
                             const QkRopeParams& params, cudaStream_t stream) {
  if (n < 0 || params.head_dim <= 0 || params.head_dim % 2 != 0 ||
      params.head_dim > 2 * kMaxPairsPerLane * kWarpSize || params.num_heads < 0 ||
      params.num_kv_heads < 0 || params.inv_freq == nullptr || params.rope_dim < 0 ||
      params.rope_dim % 2 != 0 || params.rope_dim > params.head_dim) {
    return cudaErrorInvalidValue;
  }
  const int64_t items = n * (params.num_heads + params.num_kv_heads);
  if (items == 0) return cudaSuccess;
  const int64_t blocks = (items + kThreads / kWarpSize - 1) / (kThreads / kWarpSize);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (params.rope_dim != 0 && params.rope_dim != params.head_dim) {
    QkNormPartialRopeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        q, k, n, positions, params);
  } else {
    QkNormRopeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(q, k, n, positions,
                                                                             params);
  }
  return cudaGetLastError();
}

}  // namespace strata::gpu
