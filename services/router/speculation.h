// Speculative decoding by prompt lookup: draft tokens copied from where the sequence's latest
// tokens occurred before (in its prompt or output), verified by the target model in one step
// (Sampler::AcceptDraft), and a control that turns drafting off while it does not pay.
#ifndef STRATA_SERVICES_ROUTER_SPECULATION_H_
#define STRATA_SERVICES_ROUTER_SPECULATION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"

namespace strata {

// Drafts from a model instead of prompt lookup (DraftModel). Called on the engine thread only.
class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Up to `max_tokens` tokens to follow `tokens`, the whole sequence `key` (prompt and output so
  // far; state from its earlier calls may be kept); empty when there are none.
  virtual std::vector<int32_t> Draft(uint64_t key, absl::Span<const int32_t> tokens,
                                     int max_tokens) = 0;
  // Sequence `key` ended: whatever is kept for it goes.
  virtual void Forget(uint64_t key) = 0;
};

struct SpeculationOptions {
  int max_draft_tokens = 0;  // k, tokens drafted a step at most; 0: no speculation
  int ngram_max = 3;         // the longest suffix looked up
  int ngram_min = 1;         // the shortest
  // While drafting, one step in this many runs without drafts to measure the plain rate; after
  // drafting stopped paying, it stays off for this many steps before it is tried again.
  int probe_interval = 32;
  // Drafts come from this model (speculative.draft_model) instead of prompt lookup.
  std::shared_ptr<DraftSource> draft_model;
};

// The tokens that followed an earlier occurrence of the last n tokens of `tokens`, for the
// largest n in [ngram_min, ngram_max] that occurs: the latest occurrence followed by
// `max_tokens` tokens, else the one followed by the most (at most `max_tokens` are taken);
// empty when none occurs.
std::vector<int32_t> NgramDraft(absl::Span<const int32_t> tokens, int ngram_min, int ngram_max,
                                int max_tokens);

// A sequence's draft length: grows by one after a step whose drafts were all accepted, halves
// after one that accepted none.
int NextDraftLength(int current, int drafted, int accepted, int max_draft_tokens);

// Compares tokens a second of decode steps with drafts against steps without (moving
// averages); drafting stops for probe_interval steps when it is the slower, twice as long each
// time in a row.
class SpeculationControl {
 public:
  explicit SpeculationControl(const SpeculationOptions& options) : options_(options) {}

  // Whether the next step may draft (speculation on, not cooling down, not a probe step).
  bool DraftThisStep();
  // A decode-only step: whether it drafted, its seconds and the tokens it gave.
  void RecordStep(bool drafted, double seconds, int64_t tokens);

  bool active() const { return options_.max_draft_tokens > 0 && cooldown_ == 0; }
  int64_t times_turned_off() const { return turned_off_; }

 private:
  SpeculationOptions options_;
  int64_t steps_ = 0;
  int cooldown_ = 0;
  double draft_rate_ = 0, plain_rate_ = 0;  // tokens per second
  int draft_samples_ = 0, plain_samples_ = 0;
  int64_t turned_off_ = 0;
  int losses_in_a_row_ = 0;
};

}  // namespace strata

#endif  // STRATA_SERVICES_ROUTER_SPECULATION_H_
