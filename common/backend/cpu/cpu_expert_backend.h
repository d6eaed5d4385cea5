// The reference implementation of the expert side: routed SwiGLU experts in float32 on the CPU.
#ifndef STRATA_COMMON_BACKEND_CPU_CPU_EXPERT_BACKEND_H_
#define STRATA_COMMON_BACKEND_CPU_CPU_EXPERT_BACKEND_H_

#include "common/backend/backend.h"
#include "common/model/model_weights.h"
#include "common/util/thread_pool.h"

namespace strata {

class CpuExpertBackend : public ExpertBackend {
 public:
  // `config`, `experts` and `pool` must outlive the backend.
  CpuExpertBackend(const ModelConfig& config, const ExpertWeightSource& experts, ThreadPool& pool);

  absl::Status RunExperts(int layer, const Tensor& x, const RoutingTable& routing,
                          Tensor& out) override;

 private:
  const ModelConfig& config_;
  const ExpertWeightSource& experts_;
  ThreadPool& pool_;
  Tensor gathered_, scratch_, expert_out_;
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_CPU_CPU_EXPERT_BACKEND_H_
