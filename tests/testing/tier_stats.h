// The tier tests' view of a cluster's counters: one line per worker (slots, uses by tier,
// prefetch, CPU tier, copies) and one for the router (graph replays, next-layer prediction).
#ifndef STRATA_TESTS_TESTING_TIER_STATS_H_
#define STRATA_TESTS_TESTING_TIER_STATS_H_

#include <algorithm>
#include <cstdio>
#include <string>

#include "strata/v1/cluster.pb.h"

namespace strata::testing {

inline void PrintTiers(const std::string& label, const v1::StatsResponse& stats) {
  for (const v1::WorkerStats& w : stats.workers()) {
    const v1::TierCounters& t = w.tiers();
    const double uses = std::max<double>(t.hot_hits() + t.warm_hits() + t.misses(), 1);
    std::printf(
        "%s, worker %u: hot %u + warm %u slots; uses %.0f: hot %.3f warm %.3f cold %.3f; "
        "prefetch loads %llu hits %llu; CPU tier %llu; %.1f MiB copied, %llu evictions\n",
        label.c_str(), w.index(), t.hot_slots(), t.warm_slots(), uses, t.hot_hits() / uses,
        t.warm_hits() / uses, t.misses() / uses,
        static_cast<unsigned long long>(t.prefetch_loads()),
        static_cast<unsigned long long>(t.prefetch_hits()),
        static_cast<unsigned long long>(t.cpu_tier_experts()), t.bytes_copied() / 1048576.0,
        static_cast<unsigned long long>(t.evictions()));
  }
  std::printf("%s: %llu of %llu steps replayed; next-layer prediction %.3f of %llu picks\n",
              label.c_str(), static_cast<unsigned long long>(stats.graph_steps()),
              static_cast<unsigned long long>(stats.steps()),
              static_cast<double>(stats.prefetch_correct()) /
                  std::max<uint64_t>(stats.prefetch_actual(), 1),
              static_cast<unsigned long long>(stats.prefetch_actual()));
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_TIER_STATS_H_
