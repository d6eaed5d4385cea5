// Next-token selection from float32 logits rows: greedy arg-max, and sampling with
// temperature, top-k, top-p and min-p from a counter-based RNG (common/util/philox.h), so a
// (seed, step) pair always yields the same token, the one the host's Sampler draws from the
// same logits (up to rounding).
#ifndef STRATA_COMMON_CUDA_KERNELS_SAMPLING_KERNELS_H_
#define STRATA_COMMON_CUDA_KERNELS_SAMPLING_KERNELS_H_

#include "common/cuda/cuda_types.h"

namespace strata::gpu {

// Tokens a row's recent outputs are kept for (LaunchRecordTokens), for transforms whose token
// list was made before them (SampleParams::list_step).
inline constexpr int kTokenHistory = 4;

// A token a row's logit transforms touch (LaunchApplyLogitTransforms).
struct LogitEntry {
  static constexpr uint32_t kSeen = 1;      // in the prompt or the output (repetition penalty)
  static constexpr uint32_t kHeldBack = 2;  // cannot be drawn while step < min_tokens
  int32_t token = 0;
  int32_t output_count = 0;  // times in the output, as of list_step
  float bias = 0.0f;
  uint32_t flags = 0;
};

// Per-row sampling settings, as the host's SamplingParams plus the step counter.
struct SampleParams {
  float temperature = 0.0f;  // 0: arg-max
  int top_k = 0;             // 0 (or >= vocab): no limit
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  float min_p = 0.0f;        // tokens below min_p x the most likely one's probability are out
  uint64_t seed = 0;         // per request
  uint64_t step = 0;         // per generated token: the Philox subsequence
  // Transforms before the draw (vLLM's order): bias, min_tokens, then the penalties.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t min_tokens = 0;
  // The row's LogitEntry list, sorted by token: [list_offset, + list_size) of the launch's
  // entries, counting the outputs before list_step; those from list_step to step (at most
  // kTokenHistory) are read from the row's token history.
  int32_t list_offset = 0;
  int32_t list_size = 0;
  uint64_t list_step = 0;
};

// out[r] = the index of the largest logits[r][i], the first on ties (0 when all are NaN), for
// r < n <= 65535. scratch: device memory of ArgmaxScratchBytes(n, vocab).
int64_t ArgmaxScratchBytes(int64_t n, int64_t vocab);
cudaError_t LaunchArgmax(const float* logits, int64_t n, int64_t vocab, void* scratch, int32_t* out,
                         cudaStream_t stream);

// out[r] = a token drawn from softmax(logits[r] / temperature) over the tokens top_k, min_p and
// top_p keep (common/util/token_cut.h: the host Sampler's definition, any nucleus size), by
// Gumbel max with the host's uniforms, for r < n <= 65535. A row's cut is found by one block:
// among the tokens of a band below its largest logit, ranked there, or for wide nuclei by
// radix passes over the row (`draw_first`: a wide top-p nucleus is first drawn over every kept
// token, the draw kept when the nucleus holds it, the radix passes only when it does not); a
// draw over the whole row runs on many blocks. params: device
// array of n entries; scratch: device memory of SampleScratchBytes(n, vocab). Rows with
// temperature 0 get their arg-max, or keep out[r] as it is when `keep_greedy_rows` (LaunchArgmax
// wrote out[r] for every row: greedy rows then cost nothing, and sampled rows read their
// largest logit there).
int64_t SampleScratchBytes(int64_t n, int64_t vocab);
cudaError_t LaunchSample(const float* logits, int64_t n, int64_t vocab, const SampleParams* params,
                         void* scratch, int32_t* out, cudaStream_t stream,
                         bool keep_greedy_rows = false, bool draw_first = false);

// In place, the logit transforms of each row that has some (a list or a penalty), as the
// host's Sampler applies them: logit_bias, min_tokens, the repetition penalty over the tokens
// seen, then frequency and presence over the output's counts. entries: the rows' lists (pinned
// host memory will do); history: [n][kTokenHistory], the rows' recent tokens by step.
cudaError_t LaunchApplyLogitTransforms(float* logits, int64_t n, int64_t vocab,
                                       const SampleParams* params, const LogitEntry* entries,
                                       const int32_t* history, cudaStream_t stream);

// history[r][params[r].step % kTokenHistory] = tokens[r]: each row's token of this step.
cudaError_t LaunchRecordTokens(const int32_t* tokens, int64_t n, const SampleParams* params,
                               int32_t* history, cudaStream_t stream);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_KERNELS_SAMPLING_KERNELS_H_
