// Dot products of 16 weight rows with up to 16 tokens on the tensor cores (bf16 MMA
// m16n8k16, f32 sums), shared by the grouped expert kernels and the few-token GEMV.
//
// The MMA m16n8k16 takes A (16 weight rows x 16 k) and B (16 k x 8 tokens) in fragments: lane
// (g = lane / 4, t = lane % 4) holds k = {2t, 2t + 1, 2t + 8, 2t + 9} of rows g and g + 8 (A)
// and of token g (B). The order of k within a dot product is free, as long as both operands
// use the same one: here a lane owns W consecutive columns, [W t, W t + W), of each 4W-wide
// slab (W = 16, or 32 for FP8 where the dim allows), and the slab's k-step s gives the lane's
// logical k {2t, 2t + 1} to columns W t + 4 s + {0, 1} and {2t + 8, 2t + 9} to
// W t + 4 s + {2, 3}. Each lane then loads W elements per row and per token in 16-byte
// vectors, with no shuffles and no shared memory; four lanes read 4W contiguous elements of a
// row (128 bytes of bf16, or of FP8 in wide slabs).
#ifndef STRATA_COMMON_CUDA_KERNELS_MMA_DOTS_CUH_
#define STRATA_COMMON_CUDA_KERNELS_MMA_DOTS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/cuda/cuda_types.h"
#include "common/cuda/device_utils.cuh"

namespace strata::gpu {

// The blocks of the kernels over WarpDots: four warps, each on 16 rows (the MMA's M), or under
// a split of the summed dim all four on the same 16 rows (SumSplitK).
inline constexpr int kMmaWarps = 4;
inline constexpr int kMmaRows = 16;
// Slab widths (4 x kWide elements): 64, or 128 for wide FP8 pieces.
inline constexpr int kMmaSlab = 4 * 16;
inline constexpr int kMmaWideSlab = 4 * 32;

// Whether a warp summing k_per_warp inputs of FP8 weights takes them in wide (32-element,
// 128-byte) pieces: where whole wide slabs cover it. bf16 rows load 128 bytes a piece already.
inline bool WideFp8Slabs(bool fp8, int64_t k_per_warp) {
  return fp8 && k_per_warp % kMmaWideSlab == 0;
}

// A lane's kWide consecutive elements of one row (16 or 32): kWide x sizeof(WT) bytes.
template <typename WT, int kWide>
struct Piece {
  uint4 v[kWide * sizeof(WT) / 16];
};

template <typename WT, int kWide>
__device__ __forceinline__ void LoadPiece(Piece<WT, kWide>& p, const WT* src) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
#pragma unroll
  for (int i = 0; i < static_cast<int>(kWide * sizeof(WT) / 16); ++i) p.v[i] = __ldg(s + i);
}

__device__ __forceinline__ uint32_t Component(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two E4M3 codes (the low byte first) as bf16x2, exactly: E4M3 fits bf16.
__device__ __forceinline__ uint32_t Fp8x2ToBf16x2(uint16_t two) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3));
  const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Elements 2j and 2j + 1 of a piece (j < kWide / 2, known at compile time) as bf16x2. E4M3
// is exact in bf16; the row's scale is applied to the sum.
template <typename WT, int kWide>
__device__ __forceinline__ uint32_t Word(const Piece<WT, kWide>& p, int j) {
  if constexpr (sizeof(WT) == 2) {
    return Component(p.v[j / 4], j % 4);
  } else {
    const uint32_t four = Component(p.v[j / 8], (j / 2) % 4);
    return Fp8x2ToBf16x2(static_cast<uint16_t>(j % 2 ? four >> 16 : four & 0xffffu));
  }
}

__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The warp's dot products over k_len inputs: rows[m][0] and rows[m][1] are this lane's rows
// g and g + 8 of matrix m, tokens[n] its token g of tile n (8 tokens a tile). acc[m][n][i]
// gets row g + 8 (i / 2), token 8 n + 2 t + i % 2. A slab is 4 x kWide inputs (kWide / 4
// MMA k-steps); slabs are loaded kStages - 1 ahead of use. Wide FP8 slabs (kWide 32) make each
// row's load 128 contiguous bytes, as bf16's are: 64-byte pieces left DRAM at ~60% of its rate.
template <typename WT, int kMats, int kNt, int kWide>
__device__ __forceinline__ void WarpDots(const WT* const (&rows)[kMats][2],
                                         const bf16* const (&tokens)[kNt], int64_t k_len,
                                         float (&acc)[kMats][kNt][4]) {
  constexpr int kStages = sizeof(WT) == 1 && kWide == 16 ? 3 : 2;
  constexpr int kSlab = 4 * kWide;
  struct Stage {
    Piece<WT, kWide> a[kMats][2];
    Piece<bf16, kWide> b[kNt];
  };
  Stage st[kStages];
  const int64_t col = kWide * (threadIdx.x % 4);
  auto load = [&](Stage& s, int64_t slab) {
    const int64_t k0 = slab * kSlab + col;
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      LoadPiece(s.a[m][0], rows[m][0] + k0);
      LoadPiece(s.a[m][1], rows[m][1] + k0);
    }
#pragma unroll
    for (int n = 0; n < kNt; ++n) LoadPiece(s.b[n], tokens[n] + k0);
  };
  auto compute = [&](const Stage& s) {
#pragma unroll
    for (int ks = 0; ks < kWide / 4; ++ks) {
      uint32_t b[kNt][2];
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        b[n][0] = Word(s.b[n], 2 * ks);
        b[n][1] = Word(s.b[n], 2 * ks + 1);
      }
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        const uint32_t a0 = Word(s.a[m][0], 2 * ks), a1 = Word(s.a[m][1], 2 * ks);
        const uint32_t a2 = Word(s.a[m][0], 2 * ks + 1), a3 = Word(s.a[m][1], 2 * ks + 1);
#pragma unroll
        for (int n = 0; n < kNt; ++n) Mma(acc[m][n], a0, a1, a2, a3, b[n][0], b[n][1]);
      }
    }
  };
  const int64_t slabs = k_len / kSlab;
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < slabs) load(st[j], j);
  }
  for (int64_t s = 0; s < slabs; s += kStages) {
#pragma unroll
    for (int j = 0; j < kStages; ++j) {
      if (s + j + kStages - 1 < slabs) load(st[(j + kStages - 1) % kStages], s + j + kStages - 1);
      if (s + j < slabs) compute(st[j]);
    }
  }
}

// Under a split of the summed dim, each of the block's kMmaWarps warps summed a quarter for the
// same 16 rows: the other warps hand warp 0 their sums through shared memory and it adds them
// in warp order. Every thread of the block must call it; true for warp 0, which goes on to
// store the rows.
template <int kMats, int kNt>
__device__ __forceinline__ bool SumSplitK(float (&acc)[kMats][kNt][4]) {
  __shared__ float parts[kMmaWarps - 1][kMats][kNt][4][kWarpSize];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (warp > 0) {
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) parts[warp - 1][m][n][i][lane] = acc[m][n][i];
      }
    }
  }
  __syncthreads();
  if (warp > 0) return false;
#pragma unroll
  for (int q = 0; q < kMmaWarps - 1; ++q) {
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] += parts[q][m][n][i][lane];
      }
    }
  }
  return true;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_MMA_DOTS_CUH_
