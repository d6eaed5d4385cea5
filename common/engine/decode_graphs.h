// Decode steps by CUDA graph replay: one graph per batch size, captured from ForwardPass::Run
// the first time a decode step of that many sequences runs, then replayed with the step's
// tokens, positions and block tables written into the pinned buffers the graph reads. Replay
// costs one launch instead of a launch per kernel; with experts in worker processes, the
// workers replay their own graphs and the two sides meet through flags on the GPU.
//
// A step can be launched before the one before it is read (Launch, then Wait): its tokens
// are then that step's greedy tokens, still on the device (kTokenOfPreviousStep), so the GPU
// goes from one step to the next without waiting for the host. Each batch size has a graph
// for each of two input slots, used in turn, so that a step's inputs are written while the
// other slot's step runs.
// Without CUDA in the build, nothing fits and Launch fails.
#ifndef STRATA_COMMON_ENGINE_DECODE_GRAPHS_H_
#define STRATA_COMMON_ENGINE_DECODE_GRAPHS_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/graph_step.h"
#include "common/backend/row_sampling.h"
#include "common/engine/forward_pass.h"
#include "common/kv/paged_kv_cache.h"

namespace strata {

namespace gpu {
class DeviceRouter;
}  // namespace gpu

// Longer sequences run their steps eagerly: a graph's attention is planned for its context.
// The decode attention splits each sequence's keys by its own position, so a long planned
// context costs short sequences only the width of the block tables copied each step.
inline constexpr int kDecodeGraphContext = 32768;
// The largest batch with a graph of its own that a server may ask for (a worker keeps a graph
// per batch size and layer set).
inline constexpr int kMaxDecodeGraphBatch = 64;
// A Launch token meaning: the greedy token that the step launched just before gives this row.
inline constexpr int32_t kTokenOfPreviousStep = -1;

struct DecodeGraphOptions {
  int max_context = 4096;  // keys per sequence the graphs are planned for
  int max_sequences = 1;   // the largest batch with a graph of its own
};

class DecodeGraphs {
 public:
  // Everything must outlive the graphs; `router` and `graph_steps` are the optional interfaces
  // of the forward pass's backends (RouterBackend::device_router, ExpertBackend::graph_steps).
  DecodeGraphs(ForwardPass& forward, gpu::DeviceRouter& router, ExpertBackend& experts,
               GraphStepExperts& graph_steps, PagedKvCache& kv, DecodeGraphOptions options);
  ~DecodeGraphs();

  // Whether a step of `ids` laid out by `batch` can replay a graph: one token per distinct
  // sequence, the logits of every row in order, within the graphs' sizes, an expert backend
  // that can be captured, and fewer than kMaxFailures failed steps in a row since the expert
  // backend last changed (graph_version).
  bool Fits(const BatchLayout& batch, absl::Span<const int64_t> logit_rows) const;

  // A step in two halves (its KV positions reserved). Launch starts the step (capturing its graph
  // first when needed: only with no step in flight) and returns without waiting; at most two steps
  // are in flight. With one in flight, the step must run the same sequences at the same rows one
  // position further, and a row's token may be kTokenOfPreviousStep. Wait waits for the oldest step
  // in flight and returns its greedy tokens, valid until the second launch after it.
  // Any error fails every step in flight (none is left, their keys and values to be written again
  // by the caller's eager steps) and counts as one failed step: e.g. a worker died. The greedy
  // tokens are each row's argmax (first on ties), [n] in pinned memory, or for the rows that
  // `sampling` (one per row, or none) gives a temperature, the token drawn there.
  absl::Status Launch(absl::Span<const int32_t> ids, const BatchLayout& batch,
                      absl::Span<const RowSampling> sampling = {});
  absl::StatusOr<const int32_t*> Wait();
  int in_flight() const { return static_cast<int>(in_flight_.size()); }

  // Right after a successful Wait with nothing in flight: its logits as [n, vocab] in
  // pinned memory, valid until the next step, with only `rows` copied from the device (greedy
  // rows need only the greedy tokens). A failure counts as a failed step: run the step again
  // without the graph.
  absl::StatusOr<const float*> Logits(absl::Span<const int64_t> rows);

  static constexpr int kMaxFailures = 3;

  // Whether a step of `tokens` rows would capture its graphs first (none yet for that size, or
  // the expert backend changed since).
  bool NeedsCapture(int64_t tokens) const {
    return graph_steps_.graph_version() != version_ || !graphs_.contains(static_cast<int>(tokens));
  }

  // Failed steps in a row (graphs stay off at kMaxFailures until the expert backend changes).
  int failures() const { return failures_; }
  // The longest sequence (prompt and generated tokens) a graph's attention is planned for.
  int max_context() const { return options_.max_context; }

  // Where a replayed step's time goes on the host, summed over replays (safe to read from any
  // thread). `between` is the GPU's idle time between two replays in a row: from one replay's
  // synchronize returning to the next one's launch returning (the caller's handling of the
  // tokens, the next step's planning, the workers' messages, the inputs' copies). A step
  // launched before the one before it was read makes no pair (the host's time is off the
  // GPU's path), nor do pairs more than 20 ms apart (a pause between requests).
  struct Timing {
    int64_t replays = 0;
    double replay_us = 0;    // launch returned (or the step before synchronized) -> synchronized
    int64_t overlapped = 0;  // replays launched before the one before them was read
    int64_t pairs = 0;
    double between_us = 0;
    double mean_replay_us() const { return replays > 0 ? replay_us / replays : 0.0; }
    double mean_between_us() const { return pairs > 0 ? between_us / pairs : 0.0; }
  };
  Timing timing() const;
  // A step ran without a graph (eagerly): the next replay is not paired with the last one.
  void NoteEagerStep() { last_synced_ = {}; }

 private:
  struct Graph;
  using Clock = std::chrono::steady_clock;
  // A launched step, until Wait returns it.
  struct Launched {
    int slot = 0;
    std::vector<PagedKvCache::SequenceId> sequences;
    std::vector<int64_t> positions;
    bool overlapped = false;  // launched with the step before it in flight
    Clock::time_point launch_returned;
  };
  // Graphs for both input slots of a step of `ids`, `batch`'s size (nothing in flight).
  absl::StatusOr<Graph*> Capture(absl::Span<const int32_t> ids, const BatchLayout& batch);
  // Launch's checks of a step behind the one in flight: same rows, one position on.
  absl::Status CheckFollows(absl::Span<const int32_t> ids, const BatchLayout& batch) const;
  absl::Status LaunchReplay(Graph& graph, absl::Span<const int32_t> ids, const BatchLayout& batch,
                            absl::Span<const RowSampling> sampling, bool overlapped);
  // Fails every step in flight: lets them finish (a replay whose workers were released passes
  // its waits), closes each with the expert backend, and counts one failure. Returns `cause`.
  absl::Status FailInFlight(absl::Status cause);
  // After a failed replay or logits copy: the graphs are dropped and the failure counted.
  void NoteFailure();
  void NoteTiming(const Launched& step, Clock::time_point synced);

  ForwardPass& forward_;
  gpu::DeviceRouter& router_;
  ExpertBackend& experts_;
  GraphStepExperts& graph_steps_;
  PagedKvCache& kv_;
  DecodeGraphOptions options_;
  uint64_t version_ = 0;   // graph_steps_.graph_version() the graphs were captured at
  bool prepared_ = false;  // the router backend's graph buffers exist
  int failures_ = 0;       // failed steps in a row, at failed_version_
  int last_rows_ = 0;      // rows of the last replay that succeeded (0: none since a failure)
  uint64_t failed_version_ = 0;
  std::map<int, std::unique_ptr<Graph>> graphs_;  // by batch size
  struct StepEvents;
  std::unique_ptr<StepEvents> events_;  // made with the first graph
  std::deque<Launched> in_flight_;      // oldest first
  int next_slot_ = 0;                   // the input slot of the next launch
  // A replay's positions and block tables, kept to spare two allocations a step.
  std::vector<int32_t> positions_;
  std::vector<PagedKvCache::SequenceId> sequences_;
  Clock::time_point last_synced_{};  // when the last replay's synchronize returned
  std::atomic<int64_t> replays_{0}, replay_ns_{0}, overlapped_{0}, pairs_{0}, between_ns_{0};
};

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_DECODE_GRAPHS_H_
