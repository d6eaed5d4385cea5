#include "common/engine/engine_flags.h"

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

// The help says what a flag does on the CPU and on a GPU alike: both programs run on either.
ABSL_FLAG(int, threads, 0, "CPU threads; 0 uses every hardware thread");
namespace {
constexpr double kDefaultGateTemperature = 1.0;
}  // namespace

ABSL_FLAG(double, gate_temperature, kDefaultGateTemperature, "Softmax temperature of the MoE gate");
// Scripts written before the gate's temperature had its own name still pass this.
ABSL_FLAG(std::optional<double>, router_temperature, std::nullopt,
          "deprecated: --gate-temperature, its older name");
ABSL_FLAG(int, kv_block_size, strata::KvCacheOptions().block_size,
          "Token slots per KV-cache block");
ABSL_FLAG(int64_t, kv_cache_mb, strata::KvCacheOptions().memory_mb,
          "The KV pool's memory at start, MiB, at most; a key or value element takes 4 bytes "
          "on the CPU, 2 on a GPU, 1 with --kv-cache-dtype fp8");
ABSL_FLAG(std::string, kv_cache_dtype, strata::KvDtypeName(strata::KvCacheOptions().dtype),
          "Keys and values: auto or bf16 (float32 on the CPU, bf16 on a GPU), or fp8 (E4M3 with "
          "per-head scales: the checkpoint's, else calibrated on the first "
          "--kv-cache-calibration-tokens tokens)");
ABSL_FLAG(int64_t, kv_cache_fp16_above_tokens, strata::KvCacheOptions().fp16_above_tokens,
          "With --kv-cache-dtype fp8: a sequence past this many tokens keeps 16-bit keys and "
          "values (converted when it grows past it); 0: never");
ABSL_FLAG(int64_t, kv_cache_calibration_tokens, strata::KvCacheOptions().calibration_tokens,
          "With --kv-cache-dtype fp8 and no scales in the checkpoint: tokens whose keys and "
          "values set the scales (sequences stay 16-bit until then)");

namespace strata {

absl::StatusOr<KvCacheOptions> KvCacheOptionsFromFlags(KvCacheOptions options) {
  options.block_size = absl::GetFlag(FLAGS_kv_block_size);
  options.memory_mb = absl::GetFlag(FLAGS_kv_cache_mb);
  absl::StatusOr<KvDtype> dtype = ParseKvDtype(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: ", dtype.status().message()));
  }
  options.dtype = *dtype;
  options.fp16_above_tokens = absl::GetFlag(FLAGS_kv_cache_fp16_above_tokens);
  options.calibration_tokens = absl::GetFlag(FLAGS_kv_cache_calibration_tokens);
  return options;
}

double GateTemperatureFromFlags() {
  const std::optional<double> older = absl::GetFlag(FLAGS_router_temperature);
  const double gate = absl::GetFlag(FLAGS_gate_temperature);
  return older.has_value() && gate == kDefaultGateTemperature ? *older : gate;
}

absl::string_view EngineFlagsFile() { return __FILE__; }

std::string EngineFlagHelp(absl::string_view name) {
  const absl::CommandLineFlag* flag =
      absl::FindCommandLineFlag(absl::StrReplaceAll(name, {{"-", "_"}}));
  // Abseil keeps the defining file without a leading "/" or "./".
  if (flag == nullptr || !absl::EndsWith(EngineFlagsFile(), flag->Filename())) return "";
  return flag->Help();
}

}  // namespace strata
