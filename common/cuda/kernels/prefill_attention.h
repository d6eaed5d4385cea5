// Prefill attention on the tensor cores, behind LaunchPagedAttention (a plan with
// tensor_cores set): steps whose sequences bring many query tokens each. Internal to the
// kernels; paged_attention_kernels.cu decides when it applies.
#ifndef STRATA_COMMON_CUDA_KERNELS_PREFILL_ATTENTION_H_
#define STRATA_COMMON_CUDA_KERNELS_PREFILL_ATTENTION_H_

#include "common/cuda/kernels/paged_attention_kernels.h"

namespace strata::gpu {

// Head sizes 64 and 128, up to 64 query heads a kv head.
bool PrefillAttentionFits(const PagedAttentionParams& params);

// The output of LaunchPagedAttention for params (already checked there, scale set) and
// tokens; no workspace. q rows 4-byte aligned with an even q_stride.
cudaError_t LaunchPrefillAttention(const bf16* q, const TokenBatch& tokens, const PagedKvLayer& kv,
                                   const PagedAttentionParams& params, bf16* out,
                                   cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_PREFILL_ATTENTION_H_
