// Next-token selection from float32 logits rows: greedy arg-max, and sampling with
// temperature, top-k, top-p and min-p from a counter-based RNG (common/util/philox.h), so a
// (seed, step) pair always yields the same token, the one the host's Sampler draws from the
// same logits (up to rounding).
#ifndef STRATA_COMMON_CUDA_KERNELS_SAMPLING_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_SAMPLING_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

inline constexpr int kMaxSampleTopK = 1024;

// Per-row sampling settings, as the host's SamplingParams plus the step counter.
struct SampleParams {
  float temperature = 0.0f;  // 0: arg-max
  int top_k = 0;             // 0 (or >= vocab): no limit; larger than kMaxSampleTopK is clamped
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  float min_p = 0.0f;        // tokens below min_p x the most likely one's probability are out
  uint64_t seed = 0;         // per request
  uint64_t step = 0;         // per generated token: the Philox subsequence
};

// out[r] = the index of the largest logits[r][i], the first on ties (0 when all are NaN), for
// r < n <= 65535. scratch: device memory of ArgmaxScratchBytes(n, vocab).
int64_t ArgmaxScratchBytes(int64_t n, int64_t vocab);
cudaError_t LaunchArgmax(const float* logits, int64_t n, int64_t vocab, void* scratch, int32_t* out,
                         cudaStream_t stream);

// out[r] = a token drawn from softmax(logits[r] / temperature) restricted to the top_k most
// likely tokens (ties to the lower index) and then to the smallest prefix of those whose mass
// reaches top_p, min_p applied first, as the CPU Sampler defines it. params: device array of n
// entries. With no top-k limit and top_p < 1 the nucleus is searched among the 1024 most likely
// tokens (mass still normalized over the whole vocabulary); without top-k and top-p the draw
// is exact over the whole vocabulary (Gumbel max). Rows with temperature 0 get their arg-max,
// or keep out[r] as it is when `keep_greedy_rows` (LaunchArgmax wrote it: a decode step's
// greedy rows then cost nothing here).
cudaError_t LaunchSample(const float* logits, int64_t n, int64_t vocab, const SampleParams* params,
                         int32_t* out, cudaStream_t stream, bool keep_greedy_rows = false);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_SAMPLING_KERNELS_H_
