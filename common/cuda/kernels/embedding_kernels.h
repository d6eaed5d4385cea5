// Embedding lookup: rows of a bf16 table gathered into the hidden state.
#ifndef STRATA_COMMON_CUDA_KERNELS_EMBEDDING_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_EMBEDDING_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// out[t] = table[ids[t]] for t < n; table is [vocab, hidden], out [n, hidden], both row-major.
// A negative id with fallback_ids set takes fallback_ids[t] instead (a decode step whose token
// is the previous step's argmax, still on the device). An id outside [0, vocab) yields a zero
// row (callers validate ids on the host first). Returns cudaErrorInvalidValue for bad sizes,
// else the launch's error.
cudaError_t LaunchEmbeddingGather(const bf16* table, int64_t vocab, int64_t hidden,
                                  const int32_t* ids, int64_t n, bf16* out, cudaStream_t stream,
                                  const int32_t* fallback_ids = nullptr);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_EMBEDDING_KERNELS_H_
