#include "common/backend/cuda_model_support.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

absl::Status CudaRouterSupports(const ModelConfig& c) {
  std::vector<std::string> missing;
  // The latent attention (mla) applies DeepSeek's interleaved RoPE and scaled softmax itself;
  // the standard attention kernels do neither.
  if (c.rope_interleave && !c.mla()) missing.push_back("interleaved RoPE");
  if (!c.mla() && c.softmax_scale > 0.0 &&
      std::abs(c.softmax_scale * std::sqrt(static_cast<double>(c.head_dim)) - 1.0) > 1e-12) {
    missing.push_back("a YaRN mscale on the softmax scale");
  }
  // The gate kernel keeps a token's scores in registers and shared memory sized for 384.
  if (c.num_experts > 384) {
    missing.push_back(absl::StrCat("a gate over ", c.num_experts, " experts (384 at most)"));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("the CUDA backend cannot run this ",
                                               ArchitectureName(c.arch), " model yet: it lacks ",
                                               absl::StrJoin(missing, "; "), ". Use --device cpu"));
}

}  // namespace strata
