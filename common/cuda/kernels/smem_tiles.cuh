// Moving tiles through shared memory for the tensor-core kernels (prefill attention, tiled
// grouped experts): asynchronous 16-byte copies from global memory, 8x8 bf16 matrix loads in
// MMA fragment order, and the swizzle that keeps those loads free of bank conflicts.
#ifndef STRATA_COMMON_CUDA_KERNELS_SMEM_TILES_CUH_
#define STRATA_COMMON_CUDA_KERNELS_SMEM_TILES_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::gpu {

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers (both 16-byte aligned).
__device__ __forceinline__ void CpAsync16(void* smem, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddress(smem)), "l"(global));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 bf16 matrices: lanes 8i..8i+7 give the row addresses of matrix i; r[i] gets this
// lane's pair of matrix i (row lane / 4, columns 2 (lane % 4) and + 1), or with .trans the
// pair (rows 2 (lane % 4) and + 1, column lane / 4).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(row)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(row)));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Element offset of 16-byte chunk `chunk` of row `row` in a tile of kRowElems bf16 a row
// (a multiple of 64): chunks are permuted by the row's low three bits, so the eight rows an
// 8x8 matrix load reads (and a row's eight chunks) fall in different banks.
template <int kRowElems>
__device__ __forceinline__ int SwizzledOffset(int row, int chunk) {
  return row * kRowElems + ((chunk ^ (row & 7)) << 3);
}

// Lets kKernel launch with `bytes` of dynamic shared memory (above 48 KiB it must ask): asked
// once a process and kernel, not at every launch (a process runs its kernels on one device).
template <auto kKernel>
cudaError_t AllowDynamicSmem(int bytes) {
  static const cudaError_t result =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return result;
}

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_SMEM_TILES_CUH_
