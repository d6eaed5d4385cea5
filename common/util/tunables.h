// Process-wide tunables read from the environment (STRATA_*), parsed once into one typed struct.
// They exist for comparisons and profiling, not for users: every value has a default that is
// the measured best, and every process logs the ones that differ from it at start.
//
//   STRATA_MMA_EXPERTS=0          grouped experts on CUDA cores only (no tensor cores)
//   STRATA_FLAG_WAIT=memop        cross-process flag waits by the driver's wait operation even
//                                 under MPS (default: a polling kernel under MPS)
//   STRATA_SIGNAL_SCOPE=system    flags between processes on one GPU raised at system scope
//   STRATA_GPU_CLOCK_STAMPS=DIR   router and workers append per-layer GPU clock stamps there
//   STRATA_STEP_TRIALS=off|always decode steps that fit a graph always replay it (off), or are
//                                 timed eagerly against replays whatever the replays read
//                                 from the host (always; default: only while they read much)
//   STRATA_FP8_GEMM=tensor-cores  FP8 projections of many tokens multiply FP8 tokens (a scale
//                                 each) on the tensor cores (default: dequantize, a bf16 copy
//                                 of the weights first)
//   STRATA_NUCLEUS=draw-first     a top-p nucleus too wide to rank on the device is drawn over
//                                 first and the draw kept when the nucleus holds it (default:
//                                 radix passes find the nucleus, then the draw)
#ifndef STRATA_COMMON_UTIL_TUNABLES_H_
#define STRATA_COMMON_UTIL_TUNABLES_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

struct Tunables {
  bool tensor_core_experts = true;
  bool flag_wait_memop = false;
  bool system_scope_signals = false;
  std::string gpu_clock_stamps;  // empty: none
  enum class StepTrials { kAuto, kOff, kAlways } step_trials = StepTrials::kAuto;
  bool fp8_tensor_core_gemm = false;
  bool nucleus_draw_first = false;

  bool operator==(const Tunables&) const = default;
};

// Reads the STRATA_* variables through `lookup` (null for unset). INVALID_ARGUMENT naming the
// variable for a value it does not take.
absl::StatusOr<Tunables> ParseTunables(const std::function<const char*(const char*)>& lookup);

// The process's tunables: parsed from the environment on first use (a bad value keeps that
// tunable's default; LoadTunables reports it), or as SetTunablesForTest left them.
const Tunables& GetTunables();

// Parses the environment now (a main() calls it first): the error of a bad value, else OK and
// the tunables in effect. Call before any thread reads them.
absl::StatusOr<Tunables> LoadTunables();

// LoadTunables for a main(): the error of a bad value; else logs the tunables in effect (a
// status line when any differs from its default) and returns them.
absl::StatusOr<Tunables> LoadAndLogTunables();

// "name=value" for every tunable that differs from its default, or "defaults".
std::string DescribeTunables(const Tunables& tunables);

// Replaces the process's tunables (tests). Not thread-safe against readers; GPU code that
// caches a tunable in a captured graph keeps what it captured.
void SetTunablesForTest(const Tunables& tunables);

}  // namespace strata

#endif  // STRATA_COMMON_UTIL_TUNABLES_H_
