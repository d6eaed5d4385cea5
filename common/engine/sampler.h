// Picks the next token from a row of logits: greedy, or temperature with top-k / top-p.
#ifndef STRATA_COMMON_ENGINE_SAMPLER_H_
#define STRATA_COMMON_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"

namespace strata {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, first index on ties)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // nucleus mass kept, in (0, 1]
  uint64_t seed = 0;         // same seed, same draws
};

absl::Status ValidateSamplingParams(const SamplingParams& params);

// The index of the largest of values[0, n), the first on ties, NaN never (0 when all are NaN),
// in two vectorizable passes: a greedy token of a 150k vocabulary is on every decode step's path.
int64_t ArgMax(const float* values, int64_t n);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  int32_t Sample(const float* logits, int64_t vocab);

  // Speculative decoding: whether the drafted token `draft` (proposed with certainty, as a
  // prompt-lookup draft is) stands where this sampler would draw from `logits`. Greedy: it is
  // the argmax. Otherwise exact rejection sampling: accepted with the probability p(draft) this
  // sampler gives it (temperature, top-k, top-p applied); when rejected, `replacement` is drawn
  // from p without the draft, renormalized, so the token that results is distributed as p.
  bool AcceptDraft(const float* logits, int64_t vocab, int32_t draft, int32_t& replacement);

  // Greedy: Sample is the argmax of the logits, which a device may compute instead.
  bool greedy() const { return params_.temperature == 0.0f; }

 private:
  // The candidates a draw picks among: candidates_[0, keep) with unnormalized weights summing
  // to `total` (0 when nothing is drawable).
  int64_t Candidates(const float* logits, int64_t vocab, double& total);
  // A draw from candidates_[0, keep) with weights summing to `total`.
  int32_t Draw(int64_t keep, double total);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_SAMPLER_H_
