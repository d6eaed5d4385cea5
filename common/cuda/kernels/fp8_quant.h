// FP8 E4M3 weight quantization on the device with one scale per output channel (row): scale =
// absmax / 448, q = saturate(round_to_nearest_even(w / scale)). It agrees bit for bit with the
// host's strata::QuantizeBf16RowsToFp8E4M3 (common/tensor/dtype.h), so weights may be
// quantized once at load on either side.
#ifndef STRATA_COMMON_CUDA_KERNELS_FP8_QUANT_H_
#define STRATA_COMMON_CUDA_KERNELS_FP8_QUANT_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// w: [out, in] bf16 row-major; q: [out, in] FP8 E4M3 bytes; scales: [out]. An all-zero row gets
// scale 1.
cudaError_t LaunchQuantizeFp8PerChannel(const bf16* w, int64_t out, int64_t in, uint8_t* q,
                                        float* scales, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_FP8_QUANT_H_
