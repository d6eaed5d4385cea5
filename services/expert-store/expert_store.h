// The CPU-side store of every expert's weights: copied once from the checkpoint into named
// shared memory, one segment per NUMA node with its pages bound to that node, so any worker
// process can map them read-only. The layout (layer, expert, tensor -> segment, offset, dtype,
// shape) is what strata-expert-store publishes over gRPC. A meta segment (store_meta.h) records the
// layout, the model and a checksum of every segment, so that a strata-expert-store restarted after
// a SIGKILL re-attaches to the segments instead of copying the model again.
#ifndef STRATA_SERVICES_EXPERT_STORE_EXPERT_STORE_H_
#define STRATA_SERVICES_EXPERT_STORE_EXPERT_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_weights.h"
#include "common/shm/shared_segment.h"
#include "strata/v1/cluster.pb.h"

namespace strata {

struct ExpertStoreOptions {
  // Segments are named <prefix>-experts-<generation>-<node>, the meta <prefix>-experts-meta;
  // all of them mode 0600, and only this user's own are re-attached to or removed. The prefix
  // carries a random component per cluster (`strata up`) so that another local user cannot
  // create the names first.
  std::string segment_prefix = "strata";
  bool bind_numa = true;  // bind each segment's pages to its node
  // Map the checkpoint's expert tensors where they are (the workers map its files read-only)
  // instead of copying them into shared memory: no second copy of the experts in memory, no
  // NUMA placement. Needs contiguous expert tensors (not gpt-oss's interleaved ones).
  bool in_place = false;
  // Called after each layer is copied, for progress output on large models.
  std::function<void(int layer, int num_layers, uint64_t bytes_so_far)> on_progress;
  // Status lines: a store built or re-attached to, and why one found was not adopted.
  std::function<void(const std::string& message)> log;
};

class ExpertStore {
 public:
  // Copies the model's experts into new segments with a new generation, replacing a store
  // left under the same prefix by a process that is gone. FailedPrecondition when that store's
  // owner is still running.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Build(const Model& model,
                                                            const ExpertStoreOptions& options);
  // Adopts the store a killed strata-expert-store left under the prefix (same generation, nothing
  // copied) when its meta, its layout and model and every segment's checksum match `model`;
  // otherwise says why through options.log and Builds.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Attach(const Model& model,
                                                             const ExpertStoreOptions& options);
  // options.in_place: the layout of the checkpoint's own files; its generation follows the
  // checkpoint, so a restarted strata-expert-store hands the workers the same one.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> MapInPlace(const Model& model,
                                                                 const ExpertStoreOptions& options);
  // Removes the segments: an ordered stop. After a SIGKILL they stay, for Attach.
  ~ExpertStore();

  const v1::ExpertLayout& layout() const { return layout_; }
  bool reattached() const { return reattached_; }
  uint64_t bytes_copied() const { return bytes_copied_; }  // from the checkpoint

 private:
  ExpertStore() = default;

  v1::ExpertLayout layout_;
  std::vector<SharedSegment> segments_;  // each removed with the store
  std::unique_ptr<SharedSegment> meta_;
  bool reattached_ = false;
  uint64_t bytes_copied_ = 0;
};

}  // namespace strata

#endif  // STRATA_SERVICES_EXPERT_STORE_EXPERT_STORE_H_
