// Host-side conversion of a loader WeightMatrix (any dtype, any strides: gpt-oss stores its
// experts transposed with gate and up interleaved) into the standard row-major [out, in] bf16
// layout the CUDA kernels read. Done once per expert at load.
#ifndef STRATA_COMMON_BACKEND_CUDA_EXPERT_REPACK_H_
#define STRATA_COMMON_BACKEND_CUDA_EXPERT_REPACK_H_

#include <cstdint>
#include <vector>

#include "common/model/model_weights.h"

namespace strata::gpu {

// dst[o * w.in + i] = bf16 bits of w.At(o, i); dst holds w.out * w.in elements. Walks the
// source in tiles so transposed layouts stay cache-friendly.
void RepackToRowMajorBf16(const WeightMatrix& w, uint16_t* dst);

std::vector<uint16_t> RepackToRowMajorBf16(const WeightMatrix& w);

// The bias or norm vector as contiguous bf16 bits (empty when absent).
std::vector<uint16_t> RepackVectorBf16(const WeightVector& v);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_EXPERT_REPACK_H_
