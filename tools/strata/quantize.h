// `strata quantize`: a 16- or 32-bit Hugging Face MoE checkpoint to FP8 E4M3 weights with
// per-output-channel scales, in the compressed-tensors layout (`<name>_scale` [out, 1] beside
// each FP8 `<name>`, a quantization_config in config.json), or with one scale per 128 x 128
// block as DeepSeek-V3 ships (`<name>_scale_inv`, float32); Strata and transformers load both.
#ifndef STRATA_TOOLS_STRATA_QUANTIZE_H_
#define STRATA_TOOLS_STRATA_QUANTIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tools/strata/quantize_rules.h"

namespace strata {

struct QuantizeOptions {
  std::string model_dir;
  std::string out_dir;  // must not exist or be empty unless `force` (then it is replaced)
  bool force = false;
  Fp8Scaling scaling = Fp8Scaling::kChannel;
  int num_threads = 0;    // 0: every hardware thread
  bool progress = false;  // status lines on stderr
};

struct QuantizeResult {
  int quantized_tensors = 0;  // FP8 weights written (each with a scale tensor)
  int kept_tensors = 0;       // tensors copied as they were
  uint64_t bytes_before = 0;  // tensor bytes of the input
  uint64_t bytes_after = 0;   // tensor bytes of the output, scales included
  int shards = 0;
  double seconds = 0.0;
};

// Streams the checkpoint tensor by tensor from its memory maps into a temporary directory next
// to `out_dir`, shard for shard as the input is cut, and renames it to `out_dir` once complete:
// a failure leaves nothing behind.
absl::StatusOr<QuantizeResult> Quantize(const QuantizeOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_STRATA_QUANTIZE_H_
