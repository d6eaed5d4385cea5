// The inner loop shared by the GEMV and grouped-expert kernels: a group of threads computes
// dot products of kRows weight rows (bf16 or FP8) with kNT bf16 activation rows, each thread
// taking every num_parts-th 16-byte chunk of the rows, then the group sums its partials.
//
// At one token these kernels are bound by how many weight bytes are in flight, not by
// arithmetic: each thread issues kU chunks of all kRows rows (kU * kRows 16-byte loads) before
// using any.
#ifndef STRATA_COMMON_CUDA_KERNELS_GEMV_CORE_CUH_
#define STRATA_COMMON_CUDA_KERNELS_GEMV_CORE_CUH_

#include "common/cuda/device_utils.cuh"
#include "common/cuda/pdl.cuh"

namespace strata::gpu {

inline constexpr int kGemvThreads = 256;

// Chunks per row each thread loads before it computes with any of them.
inline constexpr int kGemvUnroll = 2;

// Blocks per SM the kernels' register budget is set for: at one token 4 for bf16 weights (64
// registers), so 4 x 256 threads x 8 loads of 16 bytes are in flight per SM, 3 for FP8 (whose
// conversion needs more registers); more tokens need the registers for their accumulators.
template <int kNT, typename WT>
inline constexpr int kGemvMinBlocks = kNT > 1 ? 2 : (sizeof(WT) == 1 ? 3 : 4);

// Elements per 16-byte vector of a weight type (bf16: 8, FP8 bytes: 16).
template <typename WT>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(WT));

// One chunk of kE weights as loaded: a 16-byte vector, or one element on the scalar path.
template <typename WT, int kE>
struct RawChunk {
  uint4 v;
};
template <typename WT>
struct RawChunk<WT, 1> {
  WT v;
};

template <typename WT, int kE>
__device__ __forceinline__ RawChunk<WT, kE> LoadChunk(const WT* p) {
  if constexpr (kE == 1) {
    return {*p};
  } else {
    return {__ldg(reinterpret_cast<const uint4*>(p))};
  }
}

// The kE weights of a chunk as float.
template <typename WT, int kE>
__device__ __forceinline__ void ChunkToFloat(const RawChunk<WT, kE>& raw, float (&wv)[kE]) {
  if constexpr (kE == 1) {
    if constexpr (sizeof(WT) == 1) {
      wv[0] = __half2float(__half(__nv_cvt_fp8_to_halfraw(raw.v, __NV_E4M3)));
    } else {
      wv[0] = __bfloat162float(raw.v);
    }
  } else if constexpr (sizeof(WT) == 1) {
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw.v);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
      wv[2 * j] = f.x;
      wv[2 * j + 1] = f.y;
    }
  } else {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw.v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      wv[2 * j] = f.x;
      wv[2 * j + 1] = f.y;
    }
  }
}

// acc[t] += sum over the chunk's kE elements of w * x[t], for tokens t < nt.
template <typename WT, int kE, int kNT>
__device__ __forceinline__ void DotChunk(const RawChunk<WT, kE>& raw,
                                         const __nv_bfloat16* const (&x)[kNT], int64_t c, int nt,
                                         float (&acc)[kNT]) {
  float wv[kE];
  ChunkToFloat<WT, kE>(raw, wv);
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    if (t < nt) {
      float xv[kE];
      LoadAsFloat<kE>(x[t] + c * kE, xv);
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[t] = fmaf(wv[e], xv[e], acc[t]);
    }
  }
}

// acc[r][t] += w[r][c * kE, (c + 1) * kE) . x[t][same] over this thread's chunks c = part,
// part + num_parts, ... < in_dim / kE (kE divides in_dim). Tokens t >= nt are skipped; rows
// are always read (callers clamp row pointers into range).
//
// One token (decode): the loads of kU chunks of every row are issued before any is used
// (indices past the end are clamped for the load and skipped for the math, so the loads issue
// unconditionally), and x is read once per chunk for all rows. Several tokens: the plain loop,
// whose arithmetic per load already hides the latency.
// kPdl: the kernel was launched by LaunchPdl and x is the previous kernel's output: the first
// weight loads are issued before PdlWait(), so they overlap that kernel's tail. The caller
// still calls PdlWait() after (a thread with no chunks never got here).
template <typename WT, int kE, int kRows, int kNT, int kU = kGemvUnroll, bool kPdl = false>
__device__ __forceinline__ void AccumulateDots(const WT* const (&w)[kRows],
                                               const __nv_bfloat16* const (&x)[kNT], int nt,
                                               int64_t in_dim, int part, int num_parts,
                                               float (&acc)[kRows][kNT]) {
  if constexpr (kPdl && kNT > 1) PdlWait();
  if constexpr (kNT > 1) {
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
  } else {
    const int64_t chunks = in_dim / kE;
    for (int64_t c0 = part; c0 < chunks; c0 += int64_t{num_parts} * kU) {
      RawChunk<WT, kE> raw[kU][kRows];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t c = min(c0 + int64_t{u} * num_parts, chunks - 1);
#pragma unroll
        for (int r = 0; r < kRows; ++r) raw[u][r] = LoadChunk<WT, kE>(w[r] + c * kE);
      }
      if constexpr (kPdl) {
        if (c0 == part) PdlWait();  // the first weights are on their way; x is needed now
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t c = c0 + int64_t{u} * num_parts;
        if (c >= chunks) continue;
        float xv[kE];
        LoadAsFloat<kE>(x[0] + c * kE, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float wv[kE];
          ChunkToFloat<WT, kE>(raw[u][r], wv);
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[r][0] = fmaf(wv[e], xv[e], acc[r][0]);
        }
      }
    }
  }
}

// Sums acc over each group of num_parts consecutive threads (num_parts a multiple of 32
// dividing kGemvThreads) and calls emit(r, t, total) once per (row, token) from one thread of
// the group: the one whose part (threadIdx.x % num_parts) is r * kNT + t, so callers can load
// that row's scale or bias ahead (kRows * kNT <= 32). `red` is shared memory of kGemvThreads / 32 *
// kRows * kNT floats. All threads of the block must call it; with one warp per group it needs no
// shared memory or barrier.
template <int kRows, int kNT, typename Emit>
__device__ __forceinline__ void GroupReduce(float (&acc)[kRows][kNT], int num_parts, float* red,
                                            Emit&& emit) {
  static_assert(kRows * kNT <= kWarpSize, "part r * kNT + t emits (r, t)");
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  if (num_parts == kWarpSize) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        const float v = WarpSum(acc[r][t]);
        if (lane == r * kNT + t) emit(r, t, v);
      }
    }
    return;
  }
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
  if (part < kRows * kNT) {  // num_parts >= 32 >= kRows * kNT: one (row, token) a thread
    float total = 0.0f;
    for (int w = 0; w < warps_per_group; ++w) {
      total += red[(group * warps_per_group + w) * kRows * kNT + part];
    }
    emit(part / kNT, part % kNT, total);
  }
}

// Threads per row group for rows of `chunks` vectors. One token: as many as leave each thread
// kGemvUnroll chunks of every row (so all its loads are in flight at once). Several tokens:
// enough to cover a row in one pass. Between a warp and the block; fewer when the grid would
// be huge, so each thread loops.
inline int GemvPartsFor(int64_t chunks, int64_t row_groups, int tokens) {
  int parts = 32;
  if (tokens == 1) {
    while (parts < kGemvThreads && int64_t{parts} * 2 * kGemvUnroll <= chunks) parts *= 2;
  } else {
    while (parts < kGemvThreads && parts < chunks) parts *= 2;
  }
  while (parts > 32 && row_groups * parts > (int64_t{1} << 20)) parts /= 2;
  return parts;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_GEMV_CORE_CUH_
