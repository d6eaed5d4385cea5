#include "common/cuda/kernels/gemv_core.cuh"
#include "common/cuda/kernels/gemv_kernels.h"
#include "common/cuda/kernels/mma_dots.cuh"

namespace strata::gpu {
namespace {

// Rows per thread group: more rows give more independent loads in flight, fewer leave
// registers for more tokens.
template <int kNT>
inline constexpr int kRowsFor = kNT <= 4 ? 4 : 2;

// One matrix of a launch and the blocks that compute it: blocks [first_block, next segment's).
struct GemvSegment {
  const void* w = nullptr;
  const float* scale = nullptr;  // FP8 only
  const bf16* bias = nullptr;
  void* y = nullptr;
  int64_t out = 0;
  int64_t y_stride = 0;
  int64_t first_block = 0;
};

struct GemvSegments {
  GemvSegment seg[kGemvMaxSegments];
  int count = 0;
};

template <typename WT, int kE, int kNT, typename OutT>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<kNT, WT>)
    GemvKernel(const __grid_constant__ GemvSegments segs, int64_t in_dim,
               const bf16* __restrict__ x, int64_t x_stride, int n, int num_parts) {
  constexpr int kRows = kRowsFor<kNT>;
  __shared__ float red[kGemvThreads / kWarpSize * kRows * kNT];
  int s = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegments; ++i) {
    if (i < segs.count && blockIdx.x >= segs.seg[i].first_block) s = i;
  }
  const GemvSegment& seg = segs.seg[s];
  const int64_t out_dim = seg.out;
  const int groups = kGemvThreads / num_parts;
  const int64_t row0 =
      ((int64_t{blockIdx.x} - seg.first_block) * groups + threadIdx.x / num_parts) * kRows;
  const WT* w = static_cast<const WT*>(seg.w);
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
  PdlLaunchDependents();
  // GroupReduce has part i emit (row i / kNT, token i % kNT): that thread's row scale and bias
  // are loaded now, with the weights, rather than as a DRAM round trip after the reduction.
  const int part = threadIdx.x % num_parts;
  const bool emits = part < kRows * kNT;
  const int64_t my_row = min(row0 + part / kNT, out_dim - 1);
  const float my_scale = emits && seg.scale != nullptr ? seg.scale[my_row] : 1.0f;
  const float my_bias = emits && seg.bias != nullptr ? __bfloat162float(seg.bias[my_row]) : 0.0f;
  AccumulateDots<WT, kE, kRows, kNT, kGemvUnroll, /*kPdl=*/true>(wr, xr, n, in_dim, part, num_parts,
                                                                 acc);
  PdlWait();
  OutT* y = static_cast<OutT*>(seg.y);
  const int64_t y_stride = seg.y_stride;
  GroupReduce<kRows, kNT>(acc, num_parts, red, [&](int r, int t, float v) {
    const int64_t row = row0 + r;
    if (row >= out_dim || t >= n) return;
    StoreOut(y + t * y_stride + row, v * my_scale + my_bias);
  });
}

// Two tokens or more on the tensor cores: a warp takes 16 rows of a segment against every
// token at once (mma_dots.cuh), reading each weight once, where the CUDA-core kernel above
// spent 2.8x its one-token time on 8 tokens (FP8 q/k/v, H100). With kSplitK the block's four
// warps share 16 rows and each sums a quarter of in_dim (partials meet in shared memory): for
// launches of few rows (the MoE gate's 128, an o projection), four times the warps. Rows of
// every segment a multiple of 16, in_dim of 64 (128 for wide FP8 slabs; x4 under kSplitK).
constexpr int64_t kMmaSplitBelowTiles = 1024;  // row tiles of 16 under which k is split

template <typename WT, int kNt, int kWide, bool kSplitK, typename OutT>
__global__ void __launch_bounds__(kMmaWarps* kWarpSize)
    GemvMmaKernel(const __grid_constant__ GemvSegments segs, int64_t in_dim,
                  const bf16* __restrict__ x, int64_t x_stride, int n) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegments; ++i) {
    if (i < segs.count && blockIdx.x >= segs.seg[i].first_block) s = i;
  }
  const GemvSegment& seg = segs.seg[s];
  const int warp = threadIdx.x / kWarpSize;
  const int64_t tile = int64_t{blockIdx.x} - seg.first_block;
  const int64_t r0 = (kSplitK ? tile : tile * kMmaWarps + warp) * kMmaRows;
  PdlLaunchDependents();
  PdlWait();
  if (r0 >= seg.out) return;  // the same for a whole block under kSplitK
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int64_t k_len = kSplitK ? in_dim / kMmaWarps : in_dim;
  const int64_t k0 = kSplitK ? warp * k_len : 0;
  const WT* w = static_cast<const WT*>(seg.w);
  const WT* rows[1][2] = {{w + (r0 + g) * in_dim + k0, w + (r0 + g + 8) * in_dim + k0}};
  const bf16* tokens[kNt];
#pragma unroll
  for (int k = 0; k < kNt; ++k) tokens[k] = x + min(g + 8 * k, n - 1) * x_stride + k0;
  float acc[1][kNt][4] = {};
  WarpDots<WT, 1, kNt, kWide>(rows, tokens, k_len, acc);
  if constexpr (kSplitK) {
    if (!SumSplitK(acc)) return;
  }
  OutT* y = static_cast<OutT*>(seg.y);
#pragma unroll
  for (int k = 0; k < kNt; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = 8 * k + 2 * t + i % 2;
      if (tok >= n) continue;
      const int64_t row = r0 + g + 8 * (i / 2);
      float v = acc[0][k][i];
      if (seg.scale != nullptr) v *= seg.scale[row];
      if (seg.bias != nullptr) v += __bfloat162float(seg.bias[row]);
      StoreOut(y + tok * seg.y_stride + row, v);
    }
  }
}

bool MmaFits(const GemvSegments& segs, int64_t in_dim) {
  for (int i = 0; i < segs.count; ++i) {
    if (!GemvTensorCoresFit(segs.seg[i].out, in_dim)) return false;
  }
  return true;
}

template <typename WT, int kNt, int kWide, bool kSplitK, typename OutT>
cudaError_t LaunchMma(GemvSegments segs, int64_t in_dim, const bf16* x, int64_t x_stride, int n,
                      cudaStream_t stream) {
  int64_t blocks = 0;
  for (int i = 0; i < segs.count; ++i) {
    segs.seg[i].first_block = blocks;
    const int64_t tiles = segs.seg[i].out / kMmaRows;
    blocks += kSplitK ? tiles : (tiles + kMmaWarps - 1) / kMmaWarps;
  }
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchPdl(GemvMmaKernel<WT, kNt, kWide, kSplitK, OutT>,
                   dim3(static_cast<unsigned>(blocks)), dim3(kMmaWarps * kWarpSize), 0, stream,
                   segs, in_dim, x, x_stride, n);
}

template <typename WT, int kNt, typename OutT>
cudaError_t LaunchMmaShaped(const GemvSegments& segs, int64_t in_dim, const bf16* x,
                            int64_t x_stride, int n, cudaStream_t stream) {
  int64_t tiles = 0;
  for (int i = 0; i < segs.count; ++i) tiles += segs.seg[i].out / kMmaRows;
  constexpr bool kFp8 = sizeof(WT) == 1;
  const int64_t slab = WideFp8Slabs(kFp8, in_dim) ? kMmaWideSlab : kMmaSlab;
  const bool split = tiles < kMmaSplitBelowTiles && in_dim % (kMmaWarps * slab) == 0;
  if constexpr (kFp8) {
    if (WideFp8Slabs(kFp8, split ? in_dim / kMmaWarps : in_dim)) {
      return split ? LaunchMma<WT, kNt, 32, true, OutT>(segs, in_dim, x, x_stride, n, stream)
                   : LaunchMma<WT, kNt, 32, false, OutT>(segs, in_dim, x, x_stride, n, stream);
    }
  }
  return split ? LaunchMma<WT, kNt, 16, true, OutT>(segs, in_dim, x, x_stride, n, stream)
               : LaunchMma<WT, kNt, 16, false, OutT>(segs, in_dim, x, x_stride, n, stream);
}

template <typename WT, typename OutT>
cudaError_t LaunchMmaFor(const GemvSegments& segs, int64_t in_dim, const bf16* x,
                         int64_t x_stride, int n, cudaStream_t stream) {
  return n <= 8 ? LaunchMmaShaped<WT, 1, OutT>(segs, in_dim, x, x_stride, n, stream)
                : LaunchMmaShaped<WT, 2, OutT>(segs, in_dim, x, x_stride, n, stream);
}

// Blocks per segment and the threads per row group, from the segments' shapes.
template <typename WT, int kE, int kNT, typename OutT>
cudaError_t LaunchTyped(GemvSegments segs, int64_t in_dim, const bf16* x, int64_t x_stride, int n,
                        cudaStream_t stream) {
  constexpr int kRows = kRowsFor<kNT>;
  int64_t row_groups = 0;
  for (int i = 0; i < segs.count; ++i) row_groups += (segs.seg[i].out + kRows - 1) / kRows;
  const int parts = GemvPartsFor(in_dim / kE, row_groups, kNT);
  const int groups = kGemvThreads / parts;
  int64_t blocks = 0;
  for (int i = 0; i < segs.count; ++i) {
    segs.seg[i].first_block = blocks;
    blocks += ((segs.seg[i].out + kRows - 1) / kRows + groups - 1) / groups;
  }
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchPdl(GemvKernel<WT, kE, kNT, OutT>, dim3(static_cast<unsigned>(blocks)),
                   dim3(kGemvThreads), 0, stream, segs, in_dim, x, x_stride, n, parts);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename WT, typename OutT>
cudaError_t LaunchForWeight(const GemvSegments& segs, int64_t in_dim, const bf16* x,
                            int64_t x_stride, int n, cudaStream_t stream) {
  constexpr int kE = kVecElems<WT>;
  bool vec = in_dim % kE == 0 && x_stride % 8 == 0 && Aligned16(x);
  for (int i = 0; i < segs.count; ++i) vec = vec && Aligned16(segs.seg[i].w);
  if (!vec) return LaunchTyped<WT, 1, kGemvMaxTokens, OutT>(segs, in_dim, x, x_stride, n, stream);
  if (n == 1) return LaunchTyped<WT, kE, 1, OutT>(segs, in_dim, x, x_stride, n, stream);
  if (MmaFits(segs, in_dim)) return LaunchMmaFor<WT, OutT>(segs, in_dim, x, x_stride, n, stream);
  if (n == 2) return LaunchTyped<WT, kE, 2, OutT>(segs, in_dim, x, x_stride, n, stream);
  if (n <= 4) return LaunchTyped<WT, kE, 4, OutT>(segs, in_dim, x, x_stride, n, stream);
  if (n <= 8) return LaunchTyped<WT, kE, 8, OutT>(segs, in_dim, x, x_stride, n, stream);
  return LaunchTyped<WT, kE, 16, OutT>(segs, in_dim, x, x_stride, n, stream);
}

bool ValidWeight(const DeviceWeight& w) {
  return w.data != nullptr && w.out > 0 && w.in > 0 &&
         (w.format != WeightFormat::kFp8E4M3 || w.scale != nullptr);
}

// Runs the segments over tokens [0, n) in groups of kGemvMaxTokens; y pointers advance by
// their own strides.
cudaError_t LaunchSegments(GemvSegments segs, WeightFormat format, int64_t in_dim, const bf16* x,
                           int64_t x_stride, int64_t n, OutType y_type, cudaStream_t stream) {
  const size_t out_size = y_type == OutType::kBf16 ? sizeof(bf16) : sizeof(float);
  for (int64_t t0 = 0; t0 < n; t0 += kGemvMaxTokens) {
    const int chunk = static_cast<int>(n - t0 < kGemvMaxTokens ? n - t0 : kGemvMaxTokens);
    GemvSegments at = segs;
    for (int i = 0; i < at.count; ++i) {
      at.seg[i].y = static_cast<char*>(at.seg[i].y) + t0 * at.seg[i].y_stride * out_size;
    }
    const bf16* xc = x + t0 * x_stride;
    cudaError_t err;
    if (format == WeightFormat::kBf16) {
      err = y_type == OutType::kBf16
                ? LaunchForWeight<bf16, bf16>(at, in_dim, xc, x_stride, chunk, stream)
                : LaunchForWeight<bf16, float>(at, in_dim, xc, x_stride, chunk, stream);
    } else {
      err = y_type == OutType::kBf16
                ? LaunchForWeight<uint8_t, bf16>(at, in_dim, xc, x_stride, chunk, stream)
                : LaunchForWeight<uint8_t, float>(at, in_dim, xc, x_stride, chunk, stream);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

GemvSegment SegmentOf(const DeviceWeight& w, void* y, int64_t y_stride) {
  GemvSegment s;
  s.w = w.data;
  s.scale = w.format == WeightFormat::kFp8E4M3 ? w.scale : nullptr;
  s.bias = w.bias;
  s.y = y;
  s.out = w.out;
  s.y_stride = y_stride;
  return s;
}

}  // namespace

bool GemvTensorCoresFit(int64_t out, int64_t in) {
  return out % kMmaRows == 0 && in % kMmaSlab == 0;
}

cudaError_t LaunchGemv(const DeviceWeight& w, const bf16* x, int64_t x_stride, int64_t n, void* y,
                       OutType y_type, int64_t y_stride, cudaStream_t stream) {
  if (!ValidWeight(w) || n < 0) return cudaErrorInvalidValue;
  GemvSegments segs;
  segs.seg[0] = SegmentOf(w, y, y_stride);
  segs.count = 1;
  return LaunchSegments(segs, w.format, w.in, x, x_stride, n, y_type, stream);
}

cudaError_t LaunchGemvMulti(const DeviceWeight* const* w, void* const* y, int count, const bf16* x,
                            int64_t n, OutType y_type, cudaStream_t stream) {
  if (count < 1 || count > kGemvMaxSegments || n < 0) return cudaErrorInvalidValue;
  GemvSegments segs;
  for (int i = 0; i < count; ++i) {
    if (!ValidWeight(*w[i]) || w[i]->in != w[0]->in || w[i]->format != w[0]->format) {
      return cudaErrorInvalidValue;
    }
    segs.seg[i] = SegmentOf(*w[i], y[i], w[i]->out);
  }
  segs.count = count;
  return LaunchSegments(segs, w[0]->format, w[0]->in, x, w[0]->in, n, y_type, stream);
}

}  // namespace strata::gpu
