// What the CUDA backend cannot run yet, decided from the config alone so that every build
// (with CUDA or without) can tell and test it.
#ifndef STRATA_COMMON_BACKEND_CUDA_MODEL_SUPPORT_H_
#define STRATA_COMMON_BACKEND_CUDA_MODEL_SUPPORT_H_

#include "absl/status/status.h"
#include "common/model/model_config.h"

namespace strata {

// OK when the CUDA router backend computes `config`'s model as the CPU backend does; else
// UnimplementedError naming every missing piece, so that such a model fails to load rather
// than producing wrong tokens.
absl::Status CudaRouterSupports(const ModelConfig& config);

// OK when the CUDA expert backends (resident, tiered) can load `config`'s expert weights; else
// UnimplementedError saying what they lack (block-scaled FP8: they take per-row scales only).
absl::Status CudaExpertsSupport(const ModelConfig& config);

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_CUDA_MODEL_SUPPORT_H_
