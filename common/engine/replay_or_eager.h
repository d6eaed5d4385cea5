// Whether a decode step that fits a CUDA graph replays it or runs eagerly, chosen by timing both.
//
// A replay is usually the faster (no launches from the host), but not always on a tiered
// cluster: a replay reads the experts in no GPU slot in place over the host link, while on an
// eager step the workers copy them into slots first or share them with the CPU tier. Which is
// faster depends on the host and on how many uses miss (mixtral-8x7b FP8 under 24 GiB: eager
// steps sharing the misses 64% faster on an H100 host, 5% on an H200 host; qwen3-30b-a3b under
// 24 GiB, where almost nothing misses: replays, by far). So the runner runs a few steps the
// other way now and then, and keeps the faster.
//
// A step's time is from the end of the step before it to its own end, both decode steps of
// the same token count run the same way (the caller's host work between steps counts on both
// sides; the first step after a change of either is not timed). After `interval` steps of the
// preferred way come `trial_steps` the other way; the other way is taken when its mean is
// below the preferred way's recent mean by `margin`; either way the interval doubles (up to
// max_interval). Replays are put on trial only while they read enough from host memory to
// matter: the bytes the expert backend reports read from the host per step, at
// `host_link_bytes_per_s`, at least `host_share` of a step's time. Single-threaded (the
// engine thread) but for counts().
#ifndef STRATA_COMMON_ENGINE_REPLAY_OR_EAGER_H_
#define STRATA_COMMON_ENGINE_REPLAY_OR_EAGER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace strata {

struct ReplayOrEagerOptions {
  bool enabled = true;
  int first_interval = 32;
  int max_interval = 4096;
  int trial_steps = 5;  // the first of them untimed
  double margin = 0.03;
  // PCIe 5 x16's useful peak: the host reads' time is underestimated, never over.
  double host_link_bytes_per_s = 55e9;
  double host_share = 0.1;
  // Put replays on trial whatever they read from the host (tests, measurements).
  bool always = false;
};

class ReplayOrEager {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ReplayOrEager(ReplayOrEagerOptions options);

  // For the next step of `tokens` tokens that fits a graph, in launch order: replay it?
  // `host_bytes`: the expert backend's bytes read from host memory by replays, so far.
  bool Replay(int64_t tokens, uint64_t host_bytes);
  // A step ended at `now`, in launch order: `fits` whether it fit a graph (a step that did not
  // breaks the timing), `replayed` how it ran.
  void Ended(bool fits, int64_t tokens, bool replayed, Clock::time_point now);

  struct Counts {
    int64_t trials = 0;    // decided (not cut short)
    int64_t switches = 0;  // of the preferred way
    bool eager = false;    // the preferred way now
  };
  Counts counts() const;  // thread-safe

 private:
  struct Samples {
    std::deque<double> seconds;  // the newest last
    double Mean() const;
  };
  void Reset(int64_t tokens);
  bool WorthTrial(uint64_t host_bytes);
  void Decide();

  const ReplayOrEagerOptions options_;
  bool prefer_replay_ = true;
  int64_t tokens_ = -1;
  int since_trial_ = 0;  // preferred steps decided since the last trial (or check)
  int interval_;
  int trial_left_ = 0;       // steps still to decide the other way
  bool trial_open_ = false;  // decided the other way, not yet judged
  uint64_t host_bytes_at_ = 0;
  bool host_bytes_known_ = false;
  Samples samples_[2];  // [replayed]
  std::optional<Clock::time_point> last_end_;
  bool last_replayed_ = false;
  std::atomic<int64_t> trials_{0}, switches_{0};
  std::atomic<bool> eager_{false};
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_REPLAY_OR_EAGER_H_
