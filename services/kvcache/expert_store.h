// The CPU-side store of every expert's weights: copied once from the checkpoint into named
// shared memory, one segment per NUMA node with its pages bound to that node, so any worker
// process can map them read-only. The layout (layer, expert, tensor -> segment, offset, dtype,
// shape) is what strata-cache publishes over gRPC.
#ifndef STRATA_SERVICES_KVCACHE_EXPERT_STORE_H_
#define STRATA_SERVICES_KVCACHE_EXPERT_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_weights.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

struct ExpertStoreOptions {
  std::string segment_prefix = "strata";  // segments are named <prefix>-experts-<node>
  bool bind_numa = true;                  // bind each segment's pages to its node
  // Called after each layer is copied, for progress output on large models.
  std::function<void(int layer, int num_layers, uint64_t bytes_so_far)> on_progress;
};

class ExpertStore {
 public:
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Build(const Model& model,
                                                            const ExpertStoreOptions& options);
  ~ExpertStore();  // removes the segments

  const v1::ExpertLayout& layout() const { return layout_; }

 private:
  struct Segment;
  ExpertStore() = default;

  v1::ExpertLayout layout_;
  std::vector<std::unique_ptr<Segment>> segments_;
};

// Tensor names used in the layout, in the order each expert's tensors are laid out.
inline constexpr const char* kExpertTensorNames[] = {"gate",      "up",      "down",
                                                     "gate_bias", "up_bias", "down_bias"};

}  // namespace strata

#endif  // STRATA_SERVICES_KVCACHE_EXPERT_STORE_H_
