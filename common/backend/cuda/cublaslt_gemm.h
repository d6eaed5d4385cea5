// GEMMs through cuBLASLt for the many-token case: y[n, out] = x[n, in] W^T with W the
// row-major [out, in] weight (the "TN" layout cuBLASLt prefers), float32 accumulation; bf16
// operands, or FP8 E4M3 ones with a float scale per weight row and per token (outer-vector
// scaling: FP8 tensor cores, no bf16 copy of the weights). Descriptors and the heuristic's
// algorithm are cached per shape, operand type and alignment.
#ifndef STRATA_COMMON_BACKEND_CUDA_CUBLASLT_GEMM_H_
#define STRATA_COMMON_BACKEND_CUDA_CUBLASLT_GEMM_H_

#include <cublasLt.h>

#include <array>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda/cuda_context.h"
#include "common/cuda/cuda_types.h"

namespace strata::gpu {

class CublasLtGemm {
 public:
  // `context` must outlive this object.
  explicit CublasLtGemm(CudaContext* context) : context_(context) {}
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // w: [out, in] bf16; x: [n, in] bf16; y: [n, out], bf16 or float by y_type; all row-major
  // and packed. Enqueued on `stream`; the first call per shape queries the heuristic (host only,
  // safe inside graph capture).
  absl::Status Run(const bf16* w, int64_t out, int64_t in, const bf16* x, int64_t n, void* y,
                   OutType y_type, cudaStream_t stream);
  // The same product of FP8 E4M3 operands: y[t, o] = w_scale[o] x_scale[t] sum_i w[o, i]
  // x[t, i]. UNIMPLEMENTED when cuBLASLt has no algorithm for it (shape, alignment, or a
  // device without FP8 tensor cores): the caller takes another path.
  absl::Status RunFp8(const uint8_t* w, const float* w_scale, int64_t out, int64_t in,
                      const uint8_t* x, const float* x_scale, int64_t n, void* y, OutType y_type,
                      cudaStream_t stream);

 private:
  // (n, out, in, y_type, alignment of w, x, y, FP8 operands).
  using Key = std::array<int64_t, 8>;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // UNIMPLEMENTED: cuBLASLt has no algorithm for the key (kept, so that a caller falling
    // back every step does not query the heuristic every step).
    absl::Status missing;
  };

  absl::Status MakePlan(const Key& key, Plan& plan);
  // The cached plan for `key`, made on first use.
  absl::StatusOr<const Plan*> PlanFor(const Key& key);
  static void DestroyPlan(Plan& plan);

  CudaContext* context_;
  absl::flat_hash_map<Key, Plan> plans_;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_CUBLASLT_GEMM_H_
