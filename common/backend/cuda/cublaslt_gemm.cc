#include "common/backend/cuda/cublaslt_gemm.h"

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/util/status_macros.h"

namespace strata::gpu {
namespace {

// The largest power of two (up to 256, cuBLASLt's assumption) dividing the address.
int64_t Alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

}  // namespace

CublasLtGemm::~CublasLtGemm() {
  for (auto& [key, plan] : plans_) DestroyPlan(plan);
}

void CublasLtGemm::DestroyPlan(Plan& plan) {
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.op != nullptr) cublasLtMatmulDescDestroy(plan.op);
  plan = Plan{};
}

absl::Status CublasLtGemm::MakePlan(const Key& key, Plan& plan) {
  const auto [n, out, in, y_type, align_w, align_x, align_y, fp8] = key;
  // Column-major view: C[out, n] = op(A)[out, in] * B[in, n], where A is W read as the
  // column-major [in, out] matrix and transposed, and B is x read as column-major [in, n].
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &trans_a, sizeof(trans_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &trans_b, sizeof(trans_b)));
  const cudaDataType_t c_type =
      static_cast<OutType>(y_type) == OutType::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t ab_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  if (fp8) {
    // A's scales run along its rows after the transpose (the weight's output channels), B's
    // along its columns (the tokens).
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.a, ab_type, in, out, in));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.b, ab_type, in, n, in));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.c, c_type, out, n, out));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = context_->cublas_workspace_bytes();
  const uint32_t aw = static_cast<uint32_t>(align_w), ax = static_cast<uint32_t>(align_x),
                 ay = static_cast<uint32_t>(align_y);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                              sizeof(aw));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                              sizeof(ax));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay,
                                              sizeof(ay));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay,
                                              sizeof(ay));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(context_->cublaslt(), plan.op, plan.a, plan.b, plan.c,
                                        plan.c, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_RETURN_IF_ERROR(st);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no ", fp8 ? "fp8" : "bf16",
                                                 " algorithm for n=", n, " out=", out, " in=", in));
  }
  plan.algo = result.algo;
  return absl::OkStatus();
}

absl::StatusOr<const CublasLtGemm::Plan*> CublasLtGemm::PlanFor(const Key& key) {
  const auto [n, out, in, y_type, align_w, align_x, align_y, fp8] = key;
  if (out <= 0 || in <= 0 || n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemm: bad shape n=", n, " out=", out, " in=", in));
  }
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan plan;
    absl::Status made = MakePlan(key, plan);
    if (!made.ok()) {
      DestroyPlan(plan);
      if (!absl::IsUnimplemented(made)) return made;
      plan.missing = std::move(made);
    }
    it = plans_.emplace(key, plan).first;
  }
  if (!it->second.missing.ok()) return it->second.missing;
  return &it->second;
}

absl::Status CublasLtGemm::RunFp8(const uint8_t* w, const float* w_scale, int64_t out, int64_t in,
                                  const uint8_t* x, const float* x_scale, int64_t n, void* y,
                                  OutType y_type, cudaStream_t stream) {
  if (n == 0 && out > 0 && in > 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const Plan* plan, PlanFor({n, out, in, static_cast<int64_t>(y_type),
                                              Alignment(w), Alignment(x), Alignment(y), 1}));
  // The scales change with every weight: set on the cached descriptor for this call only.
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      context_->cublaslt(), plan->op, &alpha, w, plan->a, x, plan->b, &beta, y, plan->c, y, plan->c,
      &plan->algo, context_->cublas_workspace(), context_->cublas_workspace_bytes(), stream));
  return absl::OkStatus();
}

absl::Status CublasLtGemm::Run(const bf16* w, int64_t out, int64_t in, const bf16* x, int64_t n,
                               void* y, OutType y_type, cudaStream_t stream) {
  if (n == 0 && out > 0 && in > 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const Plan* found, PlanFor({n, out, in, static_cast<int64_t>(y_type),
                                               Alignment(w), Alignment(x), Alignment(y), 0}));
  const Plan& plan = *found;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      context_->cublaslt(), plan.op, &alpha, w, plan.a, x, plan.b, &beta, y, plan.c, y, plan.c,
      &plan.algo, context_->cublas_workspace(), context_->cublas_workspace_bytes(), stream));
  return absl::OkStatus();
}

}  // namespace strata::gpu
