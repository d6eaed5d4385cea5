// The flags strata-router and the strata tool's in-process commands share: the KV cache's,
// the CPU threads and the MoE gate's temperature. Defined here once, so that both programs
// take them under the same names, with the same defaults (KvCacheOptions) and the same help.
#ifndef STRATA_COMMON_ENGINE_ENGINE_FLAGS_H_
#define STRATA_COMMON_ENGINE_ENGINE_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/kv/paged_kv_cache.h"

ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(double, gate_temperature);
ABSL_DECLARE_FLAG(std::optional<double>, router_temperature);
ABSL_DECLARE_FLAG(int, kv_block_size);
ABSL_DECLARE_FLAG(int64_t, kv_cache_mb);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);
ABSL_DECLARE_FLAG(int64_t, kv_cache_fp16_above_tokens);
ABSL_DECLARE_FLAG(int64_t, kv_cache_calibration_tokens);

namespace strata {

// `options` with the KV-cache flags' values; the options no flag here sets (prefix_caching,
// share_expert_memory: a router's own) are kept. INVALID_ARGUMENT naming the flag for a dtype
// that is not one.
absl::StatusOr<KvCacheOptions> KvCacheOptionsFromFlags(KvCacheOptions options = {});

// --gate-temperature, or --router-temperature (its older name) when that is given and
// --gate-temperature is left at its default.
double GateTemperatureFromFlags();

// The file that defines these flags, for a program's help (DocsOfFlagsIn).
absl::string_view EngineFlagsFile();

// The help of one of these flags (dashed or underscored name), for a table that hands the
// flag on (`strata up`'s config keys); empty for a name that is not one of them.
std::string EngineFlagHelp(absl::string_view name);

}  // namespace strata

#endif  // STRATA_COMMON_ENGINE_ENGINE_FLAGS_H_
