#include "common/engine/replay_or_eager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/util/process.h"

namespace strata {
namespace {

constexpr size_t kMinSamples = 4;  // of the preferred way before a look
constexpr size_t kKeptSamples = 16;

}  // namespace

double ReplayOrEager::Samples::Mean() const {
  double sum = 0;
  for (double s : seconds) sum += s;
  return seconds.empty() ? 0 : sum / static_cast<double>(seconds.size());
}

ReplayOrEager::ReplayOrEager(ReplayOrEagerOptions options) : options_(std::move(options)) {}

double ReplayOrEager::MissShare(Way& way, uint64_t missed_bytes) {
  // A worker that started again counts from zero: nothing for this look.
  const uint64_t missed = missed_bytes - std::min(missed_bytes, way.missed_at);
  const int64_t steps = steps_ - way.steps_at;
  way.missed_at = missed_bytes;
  way.steps_at = steps_;
  const double step_s = way.samples[way.replay].Mean();
  if (steps <= 0 || step_s <= 0) return 0;
  return static_cast<double>(missed) / static_cast<double>(steps) / options_.host_link_bytes_per_s /
         step_s;
}

bool ReplayOrEager::Replay(int64_t tokens, absl::FunctionRef<uint64_t()> missed_bytes) {
  if (options_.trials == Tunables::StepTrials::kOff) return true;
  ++steps_;
  auto [it, added] = ways_.try_emplace(tokens);
  Way& way = it->second;
  if (added) {
    way.interval = std::max(options_.first_interval, 1);
    way.missed_at = missed_bytes();
    way.steps_at = steps_;
  }
  if (tokens != tokens_) {
    // Another batch: the way left cuts its trial short, and its times go stale meanwhile.
    if (auto left = ways_.find(tokens_); left != ways_.end()) {
      left->second.trial_left = 0;
      left->second.trial_open = false;
      left->second.samples[0].seconds.clear();
      left->second.samples[1].seconds.clear();
    }
    tokens_ = tokens;
  }
  if (way.trial_left > 0) {
    --way.trial_left;
    return false;
  }
  if (way.trial_open || ++way.since_check < way.interval ||
      way.samples[way.replay].seconds.size() < kMinSamples) {
    return way.replay;
  }
  way.since_check = 0;
  const bool misses = MissShare(way, missed_bytes()) >= options_.host_share;
  if (!way.replay) {
    if (!misses) Switch(way, tokens, "the misses fell");
    return way.replay;
  }
  if (!misses && options_.trials != Tunables::StepTrials::kAlways) return true;
  way.samples[0].seconds.clear();
  way.trial_left = std::max(options_.trial_steps, 2) - 1;
  way.trial_open = true;
  return false;
}

void ReplayOrEager::Ended(bool fits, int64_t tokens, bool replayed, Clock::time_point now) {
  if (options_.trials == Tunables::StepTrials::kOff) return;
  if (!fits) {
    last_end_.reset();  // the next step's time would include this one
    return;
  }
  auto it = ways_.find(tokens);
  if (it == ways_.end() || tokens != tokens_) {
    last_end_.reset();
    return;
  }
  Way& way = it->second;
  if (last_end_.has_value() && last_tokens_ == tokens && last_replayed_ == replayed) {
    std::deque<double>& s = way.samples[replayed].seconds;
    s.push_back(std::chrono::duration<double>(now - *last_end_).count());
    if (s.size() > kKeptSamples) s.pop_front();
  }
  last_end_ = now;
  last_tokens_ = tokens;
  last_replayed_ = replayed;
  if (!way.trial_open) return;
  const size_t timed = static_cast<size_t>(std::max(options_.trial_steps, 2) - 1);
  if (way.samples[0].seconds.size() >= timed) {
    Decide(way, tokens);
  } else if (way.trial_left == 0 && replayed) {
    way.trial_open = false;  // cut short (a step ran the other way than decided): no verdict
  }
}

void ReplayOrEager::Switch(Way& way, int64_t tokens, const char* why) {
  way.replay = !way.replay;
  way.interval = std::max(options_.first_interval, 1);
  switches_.fetch_add(1, std::memory_order_relaxed);
  eager_ways_.fetch_add(way.replay ? -1 : 1, std::memory_order_relaxed);
  StatusLine(absl::StrFormat("decode steps of %d token(s) run %s from now on: %s", tokens,
                             way.replay ? "by graph replay" : "eagerly", why));
}

void ReplayOrEager::Decide(Way& way, int64_t tokens) {
  way.trial_open = false;
  trials_.fetch_add(1, std::memory_order_relaxed);
  const double replayed = way.samples[1].Mean(), eager = way.samples[0].Mean();
  if (eager >= replayed * (1 - options_.margin)) {
    way.interval = std::min(way.interval * 2, std::max(options_.max_interval, 1));
    return;
  }
  Switch(way, tokens,
         absl::StrFormat("%.2f ms a step against %.2f ms replayed", eager * 1e3, replayed * 1e3)
             .c_str());
}

ReplayOrEager::Counts ReplayOrEager::counts() const {
  return {.trials = trials_.load(std::memory_order_relaxed),
          .switches = switches_.load(std::memory_order_relaxed),
          .eager = eager_ways_.load(std::memory_order_relaxed) > 0};
}

}  // namespace strata
