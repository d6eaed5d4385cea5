// Where a worker runs an expert that is on none of its GPU slots (a cold expert): copy its
// weights from strata-expert-store's shared memory into a slot and run it on the GPU, or have
// strata-expert-store compute it on its CPUs where the weights already are (CpuTierClient).
//
// Estimated seconds for one (expert, layer request) pair of `tokens` tokens:
//   copy = expert_bytes / copy_bytes_per_s / (1 + copy_reuses)
//   cpu  = cpu_overhead_s + expert_bytes / cpu_bytes_per_s
//          + tokens * 6 * hidden * intermediate / cpu_flops
// (6 = three matrices, a multiply and an add per weight per token). The GPU's own compute
// of a copied expert is left out: next to the copy it is negligible.
//
// Reuse: a copied expert stays resident, so later uses of it are free; the CPU path leaves
// nothing behind. If it is used `r` more times before eviction, the copy serves r + 1 uses,
// hence the division. The default credits no reuse: the expert is cold because the worker's
// cache policy judged it the least likely to be needed again, and the copy evicts an expert
// the same policy judged more likely to be needed, whose reload the copy will then cost.
// Workloads with bursty locality (one long prefill reusing its experts across chunks) can
// set copy_reuses > 0.
#ifndef STRATA_SERVICES_EXPERT_WORKER_COLD_PATH_MODEL_H_
#define STRATA_SERVICES_EXPERT_WORKER_COLD_PATH_MODEL_H_

#include <cstdint>

namespace strata {

enum class ColdPath { kCopy, kCpu };

// Defaults: see each field. A worker replaces the two CPU rates with its own timing of the CPU
// tier once attached (WorkerServer::CalibrateCpuTier: one expert for 1 and for 8 tokens). The
// defaults are this repository's CPU backend as measured by bench/cold_path/cold_path_bench.cc
// on a 2-core Intel Xeon VM, for the Qwen3-30B-A3B expert shape (2048 x 768 bf16, 9 MiB):
// 0.96 ms for one token, +0.16 ms per further token, 11.9 ms for 64
// (bench/profiles/cold-path-cpu-simd-2core.txt). With these defaults kAuto copies a lone miss
// over a 48.6 GB/s link; the CPU wins one-token requests below about 10 GB/s (a shared or
// older link, unpinned memory) or on a host whose CPUs stream experts faster, and takes a
// share of a step's misses either way (ColdPathSplit).
struct ColdPathOptions {
  // kCopy / kCpu force the path (configuration); kAuto compares the estimates. On the CUDA IPC
  // path a step that waits for the CPU cannot be a graph replay: there kAuto applies to eager
  // steps, while replayed decode steps read cold experts in place (the router times the two
  // and keeps the faster, ReplayOrEager); kSplit is kAuto with every step eager.
  enum Mode { kAuto, kCopy, kCpu, kSplit } mode = kAuto;
  // Host -> GPU copy bandwidth available to this worker: measured 48.6 GB/s on the H200 host
  // for one 9 MiB bf16 expert from the store's registered (pinned) segments by the CUDA expert
  // slots (41.3 GB/s into FP8 slots, quantized on the device). Lower it when GPUs share
  // a host link, or for unpinned memory, which a staged copy moves at most at memcpy speed
  // (about 12 GB/s for one thread on the VM above).
  double copy_bytes_per_s = 48.6e9;
  // The fit of the measurements above: time = bytes / cpu_bytes_per_s (streaming and
  // converting the weights, 0.78 ms) + tokens * 6 * hidden * intermediate / cpu_flops
  // (0.16 ms per token), within about 10% from 1 to 64 tokens.
  double cpu_bytes_per_s = 1.2e10;
  double cpu_flops = 5.8e10;
  // Fixed cost of one CPU-tier request, measured there as a one-token request with no expert
  // through ExpertStoreServer and CpuTierClient: 2 us back to back (both sides spinning), 35-40 us
  // with requests 1 ms apart (the store's thread asleep, as between a worker's layers);
  // about 110 us when the two sides share one core (each waits out the other's spin).
  double cpu_overhead_s = 40e-6;
  // Further uses a copied expert is expected to serve while resident (see above).
  double copy_reuses = 0.0;
};

// Estimated seconds of each path (the formulas above).
double CopyPathSeconds(const ColdPathOptions& options, uint64_t expert_bytes);
double CpuPathSeconds(const ColdPathOptions& options, uint64_t expert_bytes, int64_t tokens,
                      int64_t hidden, int64_t intermediate);

// The forced path, or the cheaper estimate (copy on a tie: it also warms the slot).
ColdPath ChooseColdPath(const ColdPathOptions& options, uint64_t expert_bytes, int64_t tokens,
                        int64_t hidden, int64_t intermediate);

// Sets options' cpu_flops and cpu_bytes_per_s from the CPU tier's seconds for one expert of
// `expert_bytes` at 1 and at `many_tokens` (> 1) tokens: the many_tokens - 1 more cost
// (many_tokens - 1) x 6 x hidden x intermediate / cpu_flops, the rest of the one-token time is
// streaming (requests back to back, the store's thread awake: no fixed cost taken off). False,
// leaving options as they were, when the two times are too close to tell the terms apart (a
// fixed cost or a cache dominates: streaming under a quarter of the one-token time).
bool FitCpuRates(double one_token_s, double many_tokens_s, int many_tokens, uint64_t expert_bytes,
                 int64_t hidden, int64_t intermediate, ColdPathOptions& options);

// One layer step's misses shared between the two paths, which run at once (the copies and the
// GPU's work on one side, strata-expert-store's CPUs on the other): each miss goes to the path
// whose running total it ends sooner (list scheduling), so that the step waits for the later of the
// two totals rather than their sum. A lone miss goes where ChooseColdPath sends it; forced
// modes ignore the totals. Not thread-safe.
class ColdPathSplit {
 public:
  ColdPathSplit(const ColdPathOptions& options, uint64_t expert_bytes, int64_t hidden,
                int64_t intermediate)
      : options_(options), bytes_(expert_bytes), hidden_(hidden), intermediate_(intermediate) {}

  // Before the first miss of a step.
  void Start() { copy_s_ = cpu_s_ = 0.0; }
  ColdPath Choose(int64_t tokens);
  // The step's estimated seconds on each path so far.
  double copy_seconds() const { return copy_s_; }
  double cpu_seconds() const { return cpu_s_; }

 private:
  const ColdPathOptions options_;
  const uint64_t bytes_;
  const int64_t hidden_, intermediate_;
  double copy_s_ = 0.0, cpu_s_ = 0.0;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_WORKER_COLD_PATH_MODEL_H_
