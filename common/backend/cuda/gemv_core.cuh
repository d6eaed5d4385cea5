// The inner loop shared by the GEMV and grouped-expert kernels: a group of threads computes
// dot products of kRows weight rows (bf16 or FP8) with kNT bf16 activation rows, each thread
// taking every num_parts-th 16-byte chunk of the rows, then the group sums its partials.
#ifndef STRATA_COMMON_BACKEND_CUDA_GEMV_CORE_CUH_
#define STRATA_COMMON_BACKEND_CUDA_GEMV_CORE_CUH_

#include "common/backend/cuda/device_utils.cuh"

namespace strata::gpu {

inline constexpr int kGemvThreads = 256;

// Elements per 16-byte vector of a weight type (bf16: 8, FP8 bytes: 16).
template <typename WT>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(WT));

// acc[r][t] += w[r][c, c + kE) . x[t][c, c + kE) over this thread's chunks c. Tokens t >= nt
// are skipped; rows are always read (callers clamp row pointers into range).
template <typename WT, int kE, int kRows, int kNT>
__device__ __forceinline__ void AccumulateDots(const WT* const (&w)[kRows],
                                               const __nv_bfloat16* const (&x)[kNT], int nt,
                                               int64_t in_dim, int part, int num_parts,
                                               float (&acc)[kRows][kNT]) {
#pragma unroll 2
  for (int64_t c = int64_t{part} * kE; c < in_dim; c += int64_t{num_parts} * kE) {
    float wv[kRows][kE];
#pragma unroll
    for (int r = 0; r < kRows; ++r) LoadAsFloat<kE>(w[r] + c, wv[r]);
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
      if (t < nt) {
        float xv[kE];
        LoadAsFloat<kE>(x[t] + c, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[r][t] = fmaf(wv[r][e], xv[e], acc[r][t]);
        }
      }
    }
  }
}

// Sums acc over each group of num_parts consecutive threads (num_parts a multiple of 32
// dividing kGemvThreads) and calls emit(r, t, total) once per (row, token) from one thread of
// the group. `red` is shared memory of kGemvThreads / 32 * kRows * kNT floats. All threads of
// the block must call it.
template <int kRows, int kNT, typename Emit>
__device__ __forceinline__ void GroupReduce(float (&acc)[kRows][kNT], int num_parts, float* red,
                                            Emit&& emit) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
      const float v = WarpSum(acc[r][t]);
      if (lane == 0) red[warp * kRows * kNT + r * kNT + t] = v;
    }
  }
  __syncthreads();
  const int warps_per_group = num_parts / kWarpSize;
  const int group = threadIdx.x / num_parts;
  const int part = threadIdx.x % num_parts;
  for (int i = part; i < kRows * kNT; i += num_parts) {
    float total = 0.0f;
    for (int w = 0; w < warps_per_group; ++w) {
      total += red[(group * warps_per_group + w) * kRows * kNT + i];
    }
    emit(i / kNT, i % kNT, total);
  }
}

// Threads per group for rows of `chunks` vectors: enough to cover a row in one pass, at
// least a warp, at most the block; fewer when the grid would be huge, so each thread loops.
inline int GemvPartsFor(int64_t chunks, int64_t rows_total_groups_hint) {
  int parts = 32;
  while (parts < kGemvThreads && parts < chunks) parts *= 2;
  while (parts > 32 && rows_total_groups_hint * parts > (int64_t{1} << 20)) parts /= 2;
  return parts;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_GEMV_CORE_CUH_
