#include "common/backend/cuda_model_support.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cuda/kernels/moe_gate_limits.h"

namespace strata {
namespace {

// The kernels and uploads read one float32 scale per output row; block scales would be applied
// to the wrong elements, so such weights are refused rather than computed wrong.
std::string BlockScaledFp8(const ModelConfig& c) {
  return absl::StrCat("block-scaled FP8 weights (quantization_config weight_block_size [",
                      c.fp8_block_rows, ", ", c.fp8_block_cols,
                      "]: each matrix's weight_scale_inv holds a scale per block; it takes "
                      "per-row FP8 scales only)");
}

}  // namespace

absl::Status CudaExpertsSupport(const ModelConfig& c) {
  if (!c.fp8_block_scaled()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("the CUDA expert backend cannot load ", BlockScaledFp8(c),
                   ". Use --device cpu, or requantize it per row: strata quantize --model DIR "
                   "--out DIR"));
}

absl::Status CudaRouterSupports(const ModelConfig& c) {
  std::vector<std::string> missing;
  if (c.fp8_block_scaled()) missing.push_back(BlockScaledFp8(c));
  // The latent attention (mla) applies DeepSeek's interleaved RoPE and scaled softmax itself;
  // the standard attention kernels do neither.
  if (c.rope_interleave && !c.mla()) missing.push_back("interleaved RoPE");
  if (!c.mla() && c.softmax_scale > 0.0 &&
      std::abs(c.softmax_scale * std::sqrt(static_cast<double>(c.head_dim)) - 1.0) > 1e-12) {
    missing.push_back("a YaRN mscale on the softmax scale");
  }
  if (c.num_experts > gpu::kMaxGateExperts) {
    missing.push_back(absl::StrCat("a gate over ", c.num_experts, " experts (",
                                   gpu::kMaxGateExperts, " at most)"));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("the CUDA backend cannot run this ", ArchitectureName(c.arch),
                   " model yet: it lacks ", absl::StrJoin(missing, "; "), ". Use --device cpu",
                   c.fp8_block_scaled() ? ", or requantize block-scaled FP8 per row: "
                                          "strata quantize --model DIR --out DIR"
                                        : ""));
}

}  // namespace strata
