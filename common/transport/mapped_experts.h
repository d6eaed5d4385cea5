// A worker's read-only view of the expert store: maps every segment the layout names and
// serves FfnWeights that point into them.
#ifndef STRATA_COMMON_TRANSPORT_MAPPED_EXPERTS_H_
#define STRATA_COMMON_TRANSPORT_MAPPED_EXPERTS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

class MappedExperts : public ExpertWeightSource {
 public:
  // Checks every tensor of every MoE layer's experts against the config.
  static absl::StatusOr<std::unique_ptr<MappedExperts>> Map(const v1::ExpertLayout& layout,
                                                            const ModelConfig& config);
  ~MappedExperts() override;

  const FfnWeights* Find(int layer, int expert) const override;
  uint64_t generation() const { return generation_; }
  // The mapped shared-memory segments (for registering them with a GPU driver as pinned host
  // memory). Checkpoint files mapped in place are left out: they hold more than the experts.
  std::vector<absl::Span<const uint8_t>> segments() const;
  // The checkpoint files mapped in place (expert_store: in-place), whole.
  std::vector<absl::Span<const uint8_t>> files() const;

 private:
  struct Mapping;
  static absl::Status CheckFileUnchanged(const v1::SharedSegmentInfo& segment);
  MappedExperts() = default;

  uint64_t generation_ = 0;
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::vector<std::vector<FfnWeights>> experts_;  // [layer][expert]; empty for dense layers
};

}  // namespace strata

#endif  // STRATA_COMMON_TRANSPORT_MAPPED_EXPERTS_H_
