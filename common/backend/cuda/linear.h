// y = W x (+ bias) on the device, choosing the kernel by token count: the GEMV kernel for a
// few tokens (memory-bound), cuBLASLt for many (compute-bound). FP8 weights on the cuBLASLt
// path: with fp8_tensor_cores, the tokens are quantized to FP8 with a scale each and multiplied
// on the FP8 tensor cores (cuBLASLt has no fp8 x bf16 product); otherwise, or where cuBLASLt
// has no FP8 algorithm, the weights are dequantized to bf16 scratch first, three more bytes a
// weight moved. FP8 keeps the GEMV kernel (tensor cores, 16 tokens a launch, each reading the
// weights again) up to more tokens (docs/cuda-ops.md).
#ifndef STRATA_COMMON_BACKEND_CUDA_LINEAR_H_
#define STRATA_COMMON_BACKEND_CUDA_LINEAR_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "common/backend/cuda/cublaslt_gemm.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/cuda_types.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/kernels/gemv_kernels.h"

namespace strata::gpu {

struct LinearOptions {
  int gemv_max_tokens = 16;      // up to this many tokens take the GEMV kernel
  int fp8_gemv_max_tokens = 64;  // the same for FP8 weights
  // Past the GEMV, FP8 weights meet FP8 tokens (quantized per token) on the tensor cores
  // instead of a bf16 copy of the weights. Unset: the tunable (STRATA_FP8_GEMM).
  std::optional<bool> fp8_tensor_cores;
};

class LinearRunner {
 public:
  // `context` must outlive this object; work goes on context->stream().
  explicit LinearRunner(CudaContext* context, LinearOptions options = {})
      : context_(context), options_(options), gemm_(context) {}

  // Whether Run takes the GEMV kernel for n tokens of w (callers that launch GEMVs of several
  // matrices at once ask first): FP8 past gemv_max_tokens only where the tensor cores take it.
  bool GemvTakes(const DeviceWeight& w, int64_t n) const {
    if (n <= options_.gemv_max_tokens) return true;
    return w.format == WeightFormat::kFp8E4M3 && n <= options_.fp8_gemv_max_tokens &&
           GemvTensorCoresFit(w.out, w.in);
  }

  // y[n, w.out] = x[n, w.in] W^T + bias, packed row-major; y bf16 or float by y_type.
  absl::Status Run(const DeviceWeight& w, const bf16* x, int64_t n, void* y, OutType y_type);

  // Grows the FP8 dequantization scratch to `elements` (out * in) now, so later calls do not
  // allocate (needed before capturing a CUDA graph).
  absl::Status ReserveFp8Scratch(int64_t elements);

 private:
  CudaContext* context_;
  LinearOptions options_;
  CublasLtGemm gemm_;
  DeviceBuffer<bf16> fp8_scratch_;
  DeviceBuffer<uint8_t> tokens_fp8_;  // fp8_tensor_cores: the tokens quantized, and their scales
  DeviceBuffer<float> token_scales_;

  // The bf16 cuBLASLt product (FP8 weights dequantized first); UNIMPLEMENTED where cuBLASLt
  // has none.
  absl::Status RunDense(const DeviceWeight& w, const bf16* x, int64_t n, void* y, OutType y_type);
  // The FP8 tensor-core product (fp8_tensor_cores); UNIMPLEMENTED where cuBLASLt has none.
  absl::Status RunFp8TensorCores(const DeviceWeight& w, const bf16* x, int64_t n, void* y,
                                 OutType y_type);
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_LINEAR_H_
