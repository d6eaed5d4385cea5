#include "services/router/speculation.h"

#include <algorithm>

namespace strata {

std::vector<int32_t> NgramDraft(absl::Span<const int32_t> tokens, int ngram_min, int ngram_max,
                                int max_tokens) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return {};
  for (int n = std::min<int64_t>(ngram_max, len - 1); n >= std::max(ngram_min, 1); --n) {
    const absl::Span<const int32_t> suffix = tokens.subspan(len - n, n);
    // The latest earlier occurrence followed by max_tokens tokens (in a repeating run the
    // latest one is followed by only a token or two), else the one followed by the most.
    int64_t best_from = -1, best_count = 0;
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_tokens, len - from);
      if (count > best_count) {
        best_from = from;
        best_count = count;
      }
      if (count == max_tokens) break;
    }
    if (best_from >= 0) {
      return std::vector<int32_t>(tokens.begin() + best_from,
                                  tokens.begin() + best_from + best_count);
    }
  }
  return {};
}

int NextDraftLength(int current, int drafted, int accepted, int max_draft_tokens) {
  if (drafted <= 0) return current;
  if (accepted == drafted) return std::min(current + 1, max_draft_tokens);
  if (accepted == 0) return std::max(current / 2, 1);
  return current;
}

bool SpeculationControl::DraftThisStep() {
  if (options_.max_draft_tokens <= 0) return false;
  ++steps_;
  if (cooldown_ > 0) {
    --cooldown_;
    return false;
  }
  return steps_ % std::max(options_.probe_interval, 2) != 0;
}

void SpeculationControl::RecordStep(bool drafted, double seconds, int64_t tokens) {
  if (options_.max_draft_tokens <= 0 || seconds <= 0) return;
  constexpr double kWeight = 0.2;  // of the newest step in the moving average
  const double rate = static_cast<double>(tokens) / seconds;
  double& average = drafted ? draft_rate_ : plain_rate_;
  int& samples = drafted ? draft_samples_ : plain_samples_;
  average = samples == 0 ? rate : average + kWeight * (rate - average);
  ++samples;
  if (drafted && draft_samples_ >= 4 && plain_samples_ >= 1) {
    if (draft_rate_ < plain_rate_) {
      // Off for probe_interval steps, twice as long each time in a row (up to 32 times): a
      // workload where drafting does not pay pays for fewer probes.
      cooldown_ = std::max(options_.probe_interval, 1) << std::min(losses_in_a_row_, 5);
      ++losses_in_a_row_;
      draft_samples_ = 0;  // measured afresh when it is tried again
      ++turned_off_;
    } else {
      losses_in_a_row_ = 0;
    }
  }
}

}  // namespace strata
