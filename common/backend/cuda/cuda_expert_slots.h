// ExpertSlots in CUDA device memory, for tiered expert workers. Loads are queued on a copy
// stream of their own, so they overlap the compute stream's kernels; each slot has an event
// the compute stream waits on before a launch that reads the slot, and the copy stream waits
// for the last launch that read a slot before overwriting it. The slots' backend() takes host
// float32 input and host routing and returns host float32, as StagedCudaExpertBackend does.
//
// Threads: Load and Release may run on one thread while RunExperts runs on another; Loads are
// serialized among themselves, and RunExperts takes one call at a time.
#ifndef STRATA_COMMON_BACKEND_CUDA_CUDA_EXPERT_SLOTS_H_
#define STRATA_COMMON_BACKEND_CUDA_CUDA_EXPERT_SLOTS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/backend/expert_slots.h"
#include "common/cuda/cuda_types.h"
#include "common/model/model_config.h"

namespace strata::gpu {

struct CudaExpertSlotOptions {
  WeightFormat format = WeightFormat::kBf16;
  int max_tokens = 512;  // per RunExperts call
  int num_slots = 0;
  // Slots backed by device memory at creation (ExpertSlots::SetUsableSlots); -1: all. A worker
  // starts with none and takes what its registration leaves it (memory lent to the router's KV
  // pool stays there when the worker starts again).
  int usable_slots = -1;
};

// Device bytes of one slot for `config`'s experts in `format` (what ExpertSlots::slot_bytes
// returns), so a worker can size its slots from a byte budget. Besides the slots, the slots
// take a fixed few MB: the kernels' workspace for max_tokens, the staged input and output and,
// for FP8, one bf16 matrix to quantize from.
uint64_t CudaExpertSlotBytes(const ModelConfig& config, WeightFormat format);

// `config` must outlive the slots.
absl::StatusOr<std::unique_ptr<ExpertSlots>> CreateCudaExpertSlots(const ModelConfig& config,
                                                                   int device,
                                                                   CudaExpertSlotOptions options);

}  // namespace strata::gpu

#endif  // STRATA_COMMON_BACKEND_CUDA_CUDA_EXPERT_SLOTS_H_
