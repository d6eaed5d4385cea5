// Expert slots in this process's own memory, computed by the CPU expert backend. A CPU worker
// with a memory budget keeps its resident experts here (private, NUMA-local pages) and reads
// only cold experts from the expert store; the tier logic is the same as on a GPU.
#ifndef STRATA_COMMON_BACKEND_CPU_CPU_EXPERT_SLOTS_H_
#define STRATA_COMMON_BACKEND_CPU_CPU_EXPERT_SLOTS_H_

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/backend/cpu/cpu_expert_backend.h"
#include "common/backend/expert_slots.h"
#include "common/util/thread_pool.h"

namespace strata {

// Bytes of one expert copied in `dtype` (the store's), with biases when `biased`.
uint64_t CpuExpertSlotBytes(const ModelConfig& config, DType dtype, bool biased);

class CpuExpertSlots : public ExpertSlots, private ExpertWeightSource {
 public:
  // Every slot holds an expert's gate, up, down (and biases when `biased`) in `dtype`.
  static absl::StatusOr<std::unique_ptr<CpuExpertSlots>> Create(const ModelConfig& config,
                                                                int num_slots, DType dtype,
                                                                bool biased, ThreadPool& pool);

  int num_slots() const override { return static_cast<int>(bound_.size()); }
  uint64_t slot_bytes() const override { return slot_bytes_; }
  absl::Status SetUsableSlots(int n) override;
  int usable_slots() const override { return usable_; }
  absl::Status Load(int slot, int layer, int expert, const FfnWeights& weights) override;
  void Release(int slot) override;
  ExpertBackend& backend() override { return *backend_; }

 private:
  CpuExpertSlots(const ModelConfig& config, DType dtype, bool biased)
      : config_(config), dtype_(dtype), biased_(biased) {}
  const FfnWeights* Find(int layer, int expert) const override;

  const ModelConfig& config_;
  DType dtype_;
  bool biased_;
  uint64_t slot_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> memory_;  // [slot]; null past usable_
  int usable_ = 0;
  std::vector<FfnWeights> weights_;         // [slot], pointing into memory_
  std::vector<std::pair<int, int>> bound_;  // [slot] -> (layer, expert); (-1, -1) free
  absl::flat_hash_map<std::pair<int, int>, int> slot_of_;
  std::unique_ptr<CpuExpertBackend> backend_;
};

}  // namespace strata

#endif  // STRATA_COMMON_BACKEND_CPU_CPU_EXPERT_SLOTS_H_
