#include "common/backend/cuda_model_support.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
                   ". Use --device cpu, or strata quantize a 16-bit checkpoint with "
                   "--fp8-scaling channel"));
}

absl::Status CudaRouterSupports(const ModelConfig& c) {
  std::vector<std::string> missing;
  if (c.fp8_block_scaled()) missing.push_back(BlockScaledFp8(c));
  if (c.mla()) {
    missing.push_back(absl::StrCat("multi-head latent attention (a latent KV cache of ",
                                   c.KvHeadDim(),
                                   " values per token and layer, q/kv low-rank "
                                   "projections with their norms)"));
  }
  if (c.rope_interleave) missing.push_back("interleaved RoPE");
  if (c.softmax_scale > 0.0 &&
      std::abs(c.softmax_scale * std::sqrt(static_cast<double>(c.head_dim)) - 1.0) > 1e-12) {
    missing.push_back("a YaRN mscale on the softmax scale");
  }
  if (c.RopeDim() != c.head_dim && !c.mla()) {
    missing.push_back(absl::StrCat("partial rotary embedding (RoPE on ", c.RopeDim(), " of ",
                                   c.head_dim, " head dimensions)"));
  }
  if (c.gate_scoring == GateScoring::kSigmoidGrouped) {
    missing.push_back(
        "sigmoid group-limited routing with a correction bias and routed_scaling_factor");
  }
  if (c.shared_expert_intermediate_size > 0 && !c.shared_expert_gate) {
    missing.push_back("shared experts without a gate");
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("the CUDA backend cannot run this ",
                                               ArchitectureName(c.arch), " model yet: it lacks ",
                                               absl::StrJoin(missing, "; "), ". Use --device cpu"));
}

}  // namespace strata
