// Runs one per-layer request from the router on this worker's expert backend.
#ifndef STRATA_COMMON_TRANSPORT_EXPERT_EXECUTOR_H_
#define STRATA_COMMON_TRANSPORT_EXPERT_EXECUTOR_H_

#include "common/backend/backend.h"
#include "common/model/model_config.h"
#include "common/transport/expert_wire.h"

namespace strata {

class ExpertExecutor {
 public:
  ExpertExecutor(const ModelConfig& config, ExpertBackend& backend)
      : config_(config), backend_(backend) {}

  // Computes the weighted sum of the request's experts per token into partial(). Not
  // thread-safe: one request at a time.
  absl::Status Run(const ExpertRequestView& request);
  const Tensor& partial() const { return partial_; }

 private:
  const ModelConfig& config_;
  ExpertBackend& backend_;
  Tensor x_, partial_;
  RoutingTable routing_;
};

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_EXPERT_EXECUTOR_H_
