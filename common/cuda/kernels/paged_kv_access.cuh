// Device-side addressing of the paged KV cache's slots (bf16 caches, and FP8 caches with
// their wide rows) and the conversions between its codes and floats.
#ifndef STRATA_COMMON_CUDA_KERNELS_PAGED_KV_ACCESS_CUH_
#define STRATA_COMMON_CUDA_KERNELS_PAGED_KV_ACCESS_CUH_

#include <cuda_fp8.h>

#include "common/cuda/kernels/paged_kv_kernels.h"

namespace strata::gpu {

// Where one slot's key row and value row start (byte addresses), plus `elem` elements.
struct KvSlotPtrs {
  uint8_t* k;
  uint8_t* v;
};

// A row's kind, the same for all its positions: bf16 elements (a bf16 cache, or a wide row of
// an FP8 cache) or E4M3 codes.
__device__ __forceinline__ bool KvRowIsWide(const PagedKvLayer& kv, const int32_t* table) {
  return kv.fp8 && table[0] < 0;
}

// The slot of position `slot` in the block(s) a table gives for its block: e0 (and e1, a wide
// row's value block) as the table stores them.
__device__ __forceinline__ KvSlotPtrs KvSlotFromEntries(const PagedKvLayer& kv, bool wide,
                                                        int32_t e0, int32_t e1, int64_t slot,
                                                        int64_t elem, int64_t kv_dim) {
  const int64_t bs = kv.block_size;
  uint8_t* base = reinterpret_cast<uint8_t*>(kv.data);
  const int64_t stride =
      kv.block_stride > 0 ? kv.block_stride : PagedKvBlockBytes(kv.block_size, kv_dim, kv.fp8);
  if (!kv.fp8) {
    uint8_t* k = base + int64_t{e0} * stride + (slot * kv_dim + elem) * 2;
    return {k, k + bs * kv_dim * 2};
  }
  if (wide) {
    const int64_t offset = (slot * kv_dim + elem) * 2;
    return {base + (-int64_t{e0} - 1) * stride + offset,
            base + (-int64_t{e1} - 1) * stride + offset};
  }
  uint8_t* k = base + int64_t{e0} * stride + slot * kv_dim + elem;
  return {k, k + bs * kv_dim};
}

// The slot of `position` of the row `table` (wide as KvRowIsWide says).
__device__ __forceinline__ KvSlotPtrs KvSlotAt(const PagedKvLayer& kv, const int32_t* table,
                                               bool wide, int64_t position, int64_t elem,
                                               int64_t kv_dim) {
  const int64_t b = position / kv.block_size;
  const int32_t e0 = wide ? table[2 * b] : table[b];
  const int32_t e1 = wide ? table[2 * b + 1] : 0;
  return KvSlotFromEntries(kv, wide, e0, e1, position % kv.block_size, elem, kv_dim);
}

__device__ __forceinline__ uint8_t FloatToE4M3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float E4M3ToFloat(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// Eight E4M3 codes (the low 8 bytes of raw) times `scale`.
__device__ __forceinline__ void E4M3x8ToFloat(const uint4& raw, float scale, float (&f)[8]) {
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3);
    const float2 v = __half22float2(__half2(h));
    f[2 * j] = v.x * scale;
    f[2 * j + 1] = v.y * scale;
  }
}

// Eight floats as eight bf16 (16 bytes).
__device__ __forceinline__ uint4 FloatX8ToBf16(const float (&f)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  return raw;
}

// 16 bytes of a slot's row at `p`: eight bf16, or eight E4M3 codes in the low 8 bytes.
__device__ __forceinline__ uint4 LoadKvChunk(const uint8_t* p, bool codes) {
  if (codes) {
    const uint2 c = __ldg(reinterpret_cast<const uint2*>(p));
    return make_uint4(c.x, c.y, 0, 0);
  }
  return __ldg(reinterpret_cast<const uint4*>(p));
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_PAGED_KV_ACCESS_CUH_
