#include "common/backend/cuda/linear.h"

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/kernels/elementwise_kernels.h"
#include "common/cuda/kernels/fp8_quant.h"
#include "common/cuda/kernels/gemv_kernels.h"
#include "common/util/status_macros.h"
#include "common/util/tunables.h"

namespace strata::gpu {

absl::Status LinearRunner::ReserveFp8Scratch(int64_t elements) {
  if (elements <= static_cast<int64_t>(fp8_scratch_.size())) return absl::OkStatus();
  fp8_scratch_.Reset();
  ASSIGN_OR_RETURN(fp8_scratch_, DeviceBuffer<bf16>::Allocate(elements));
  return absl::OkStatus();
}

absl::Status LinearRunner::Run(const DeviceWeight& w, const bf16* x, int64_t n, void* y,
                               OutType y_type) {
  if (w.data == nullptr || w.out <= 0 || w.in <= 0 || n < 0 ||
      (w.format == WeightFormat::kFp8E4M3 && w.scale == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: bad weight [", w.out, ", ", w.in, "] or token count ", n));
  }
  if (n == 0) return absl::OkStatus();
  cudaStream_t stream = context_->stream();
  if (GemvTakes(w, n)) {
    CUDA_RETURN_IF_ERROR(LaunchGemv(w, x, w.in, n, y, y_type, w.out, stream));
    return absl::OkStatus();
  }
  const bool fp8_cores = w.format == WeightFormat::kFp8E4M3 &&
                         options_.fp8_tensor_cores.value_or(GetTunables().fp8_tensor_core_gemm);
  absl::Status gemm =
      fp8_cores ? RunFp8TensorCores(w, x, n, y, y_type) : RunDense(w, x, n, y, y_type);
  if (fp8_cores && absl::IsUnimplemented(gemm)) gemm = RunDense(w, x, n, y, y_type);
  if (absl::IsUnimplemented(gemm)) {
    // cuBLASLt has no kernel for this shape or alignment: the GEMV kernel is always correct.
    CUDA_RETURN_IF_ERROR(LaunchGemv(w, x, w.in, n, y, y_type, w.out, stream));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(gemm);
  if (w.bias != nullptr) {
    CUDA_RETURN_IF_ERROR(LaunchAddBias(y, y_type, w.bias, n, w.out, stream));
  }
  return absl::OkStatus();
}

absl::Status LinearRunner::RunFp8TensorCores(const DeviceWeight& w, const bf16* x, int64_t n,
                                             void* y, OutType y_type) {
  cudaStream_t stream = context_->stream();
  if (static_cast<int64_t>(tokens_fp8_.size()) < n * w.in) {
    tokens_fp8_.Reset();
    ASSIGN_OR_RETURN(tokens_fp8_, DeviceBuffer<uint8_t>::Allocate(n * w.in));
  }
  if (static_cast<int64_t>(token_scales_.size()) < n) {
    token_scales_.Reset();
    ASSIGN_OR_RETURN(token_scales_, DeviceBuffer<float>::Allocate(n));
  }
  // A token is a row: per-channel quantization of the weights is per-token quantization here.
  CUDA_RETURN_IF_ERROR(
      LaunchQuantizeFp8PerChannel(x, n, w.in, tokens_fp8_.data(), token_scales_.data(), stream));
  return gemm_.RunFp8(static_cast<const uint8_t*>(w.data), w.scale, w.out, w.in, tokens_fp8_.data(),
                      token_scales_.data(), n, y, y_type, stream);
}

absl::Status LinearRunner::RunDense(const DeviceWeight& w, const bf16* x, int64_t n, void* y,
                                    OutType y_type) {
  cudaStream_t stream = context_->stream();
  const bf16* dense = static_cast<const bf16*>(w.data);
  if (w.format == WeightFormat::kFp8E4M3) {
    RETURN_IF_ERROR(ReserveFp8Scratch(w.out * w.in));
    CUDA_RETURN_IF_ERROR(LaunchDequantizeFp8(static_cast<const uint8_t*>(w.data), w.scale, w.out,
                                             w.in, fp8_scratch_.data(), stream));
    dense = fp8_scratch_.data();
  }
  return gemm_.Run(dense, w.out, w.in, x, n, y, y_type, stream);
}

}  // namespace strata::gpu
