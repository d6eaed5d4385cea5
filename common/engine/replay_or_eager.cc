#include "common/engine/replay_or_eager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/util/process.h"

namespace strata {
namespace {

constexpr size_t kMinSamples = 4;  // of the preferred way before a trial
constexpr size_t kKeptSamples = 16;

}  // namespace

double ReplayOrEager::Samples::Mean() const {
  double sum = 0;
  for (double s : seconds) sum += s;
  return seconds.empty() ? 0 : sum / static_cast<double>(seconds.size());
}

ReplayOrEager::ReplayOrEager(ReplayOrEagerOptions options)
    : options_(std::move(options)), interval_(std::max(options_.first_interval, 1)) {}

void ReplayOrEager::Reset(int64_t tokens) {
  tokens_ = tokens;
  samples_[0].seconds.clear();
  samples_[1].seconds.clear();
  trial_left_ = 0;
  trial_open_ = false;
}

bool ReplayOrEager::WorthTrial(uint64_t host_bytes) {
  if (!prefer_replay_ || options_.always) return true;
  // What replays read from the host since the last look, per step (a worker that started
  // again counts from zero: nothing for this look).
  const uint64_t read = host_bytes - std::min(host_bytes, host_bytes_at_);
  host_bytes_at_ = host_bytes;
  if (since_trial_ <= 0) return false;
  const double per_step = static_cast<double>(read) / since_trial_ / options_.host_link_bytes_per_s;
  return per_step >= options_.host_share * samples_[1].Mean();
}

bool ReplayOrEager::Replay(int64_t tokens, uint64_t host_bytes) {
  if (!options_.enabled) return true;
  if (!host_bytes_known_) {
    host_bytes_at_ = host_bytes;
    host_bytes_known_ = true;
  }
  if (tokens != tokens_) Reset(tokens);
  if (trial_left_ > 0) {
    --trial_left_;
    return !prefer_replay_;
  }
  ++since_trial_;
  if (!trial_open_ && since_trial_ >= interval_ &&
      samples_[prefer_replay_].seconds.size() >= kMinSamples) {
    const bool worth = WorthTrial(host_bytes);
    since_trial_ = 0;
    if (worth) {
      samples_[!prefer_replay_].seconds.clear();
      trial_left_ = std::max(options_.trial_steps, 2) - 1;
      trial_open_ = true;
      return !prefer_replay_;
    }
  }
  return prefer_replay_;
}

void ReplayOrEager::Ended(bool fits, int64_t tokens, bool replayed, Clock::time_point now) {
  if (!options_.enabled) return;
  if (!fits || tokens != tokens_) {
    last_end_.reset();  // the next step's time would include this one
    return;
  }
  if (last_end_.has_value() && last_replayed_ == replayed) {
    std::deque<double>& s = samples_[replayed].seconds;
    s.push_back(std::chrono::duration<double>(now - *last_end_).count());
    if (s.size() > kKeptSamples) s.pop_front();
  }
  last_end_ = now;
  last_replayed_ = replayed;
  if (!trial_open_) return;
  const size_t timed = static_cast<size_t>(std::max(options_.trial_steps, 2) - 1);
  if (samples_[!prefer_replay_].seconds.size() >= timed) {
    Decide();
  } else if (trial_left_ == 0 && replayed == prefer_replay_) {
    trial_open_ = false;  // cut short (a step ran the other way than decided): no verdict
  }
}

void ReplayOrEager::Decide() {
  trial_open_ = false;
  trials_.fetch_add(1, std::memory_order_relaxed);
  // Every verdict doubles the interval, a switch too: a trial can be misled by what the other
  // way left behind (eager steps copy their misses into slots, so the replays right after them
  // miss less), and a switch made on it is undone by a later trial at the same growing cost.
  interval_ = std::min(interval_ * 2, std::max(options_.max_interval, 1));
  const double mine = samples_[prefer_replay_].Mean();
  const double theirs = samples_[!prefer_replay_].Mean();
  if (theirs >= mine * (1 - options_.margin)) return;
  prefer_replay_ = !prefer_replay_;
  switches_.fetch_add(1, std::memory_order_relaxed);
  eager_.store(!prefer_replay_, std::memory_order_relaxed);
  Log(LogLevel::kInfo,
      absl::StrFormat("decode steps of %d token(s): %s %.2f ms a step against %.2f ms %s; "
                      "running them %s",
                      tokens_, prefer_replay_ ? "replayed" : "eager", theirs * 1e3, mine * 1e3,
                      prefer_replay_ ? "eager" : "replayed",
                      prefer_replay_ ? "by graph replay" : "eagerly"));
}

ReplayOrEager::Counts ReplayOrEager::counts() const {
  return {.trials = trials_.load(std::memory_order_relaxed),
          .switches = switches_.load(std::memory_order_relaxed),
          .eager = eager_.load(std::memory_order_relaxed)};
}

}  // namespace strata
