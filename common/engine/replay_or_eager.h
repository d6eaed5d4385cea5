// Whether a decode step that fits a CUDA graph replays it or runs eagerly, chosen by timing both.
//
// A replay is usually the faster (no launches from the host), but not always on a tiered
// cluster: a replay reads the experts in no GPU slot in place over the host link, while on an
// eager step the workers copy them into slots first or share them with the CPU tier. Which is
// faster depends on the host's link and on how many uses miss (measured both ways on two hosts:
// docs/architecture.md, section 2, step 3). So where replays miss much, the runner tries a few
// eager steps now and then, and keeps the faster way.
//
// Each token count (batch size) chooses for itself. A step's time is from the end of the step
// before it to its own end, both decode steps of that token count run the same way (the
// caller's host work between steps counts on both sides; the first step after a change of
// either is not timed). Every `interval` steps of a token count its expert misses are looked
// at: the bytes the expert backend reports missed per step (all token counts together) at
// `host_link_bytes_per_s`, against the mean step. While replaying, misses of at least
// `host_share` of a step put eager steps on trial: `trial_steps` of them, taken when their mean
// is below the replays' recent mean by `margin`; either way the interval doubles (up to
// max_interval). While running eagerly, replays come back once the misses fall below that
// share. Replays are not put on trial against eager steps by timing: right after eager steps,
// which copy their misses into slots, replays miss less than they will a few steps on, and
// such a trial would favour them. Single-threaded (the engine thread) but for counts().
#ifndef STRATA_COMMON_ENGINE_REPLAY_OR_EAGER_H_
#define STRATA_COMMON_ENGINE_REPLAY_OR_EAGER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "common/util/tunables.h"

namespace strata {

struct ReplayOrEagerOptions {
  // kAuto: eager steps tried where replays miss much (below); kOff: every step that fits a
  // graph replays it; kAlways: eager steps tried whatever the misses (tests, measurements).
  Tunables::StepTrials trials = Tunables::StepTrials::kAuto;
  int first_interval = 32;
  int max_interval = 4096;
  int trial_steps = 5;  // the first of them untimed
  double margin = 0.03;
  // PCIe 5 x16's useful peak: the host reads' time is underestimated, never over.
  double host_link_bytes_per_s = 55e9;
  double host_share = 0.1;
};

class ReplayOrEager {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ReplayOrEager(ReplayOrEagerOptions options);

  // For the next step of `tokens` tokens that fits a graph, in launch order: replay it?
  // `missed_bytes`: the expert backend's bytes of experts missed (in no GPU slot) so far, asked
  // only when the misses are looked at (every `interval` steps, not every step).
  bool Replay(int64_t tokens, absl::FunctionRef<uint64_t()> missed_bytes);
  // A step ended at `now`, in launch order: `fits` whether it fit a graph (a step that did not
  // breaks the timing), `replayed` how it ran.
  void Ended(bool fits, int64_t tokens, bool replayed, Clock::time_point now);

  struct Counts {
    int64_t trials = 0;    // decided (not cut short)
    int64_t switches = 0;  // of a token count's way, either way
    bool eager = false;    // some token count runs eagerly now
  };
  Counts counts() const;  // thread-safe

 private:
  struct Samples {
    std::deque<double> seconds;  // the newest last
    double Mean() const;
  };
  // One token count's choice.
  struct Way {
    bool replay = true;
    int since_check = 0;  // steps decided since the last look at the misses
    int interval = 0;
    int trial_left = 0;       // eager steps still to decide
    bool trial_open = false;  // eager steps decided, not yet judged
    Samples samples[2];       // [replayed]
    uint64_t missed_at = 0;   // missed bytes and steps_ at the last look
    int64_t steps_at = 0;
  };
  // The seconds the misses since the way's last look take over the host link per step, as a
  // share of its preferred mean step.
  double MissShare(Way& way, uint64_t missed_bytes);
  void Switch(Way& way, int64_t tokens, const char* why);
  void Decide(Way& way, int64_t tokens);

  const ReplayOrEagerOptions options_;
  std::map<int64_t, Way> ways_;
  int64_t tokens_ = -1;  // of the last step decided
  int64_t steps_ = 0;    // decided, of every token count
  std::optional<Clock::time_point> last_end_;
  int64_t last_tokens_ = -1;
  bool last_replayed_ = false;
  std::atomic<int64_t> trials_{0}, switches_{0};
  std::atomic<int> eager_ways_{0};
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_REPLAY_OR_EAGER_H_
