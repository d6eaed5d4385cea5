// The GPU's global timer stamped at chosen points of a stream (captured graphs included): a
// profile of a replayed decode step across the router and its workers, which read the same
// clock on one GPU, where Nsight Systems cannot run. Profiling only: each stamp is one small
// kernel on the critical path (a microsecond or two), so absolute figures come out a little
// high; the split between phases is what it is for. bench/gpu/stamps_report.py reads the files.
#ifndef STRATA_COMMON_CUDA_CLOCK_STAMPS_H_
#define STRATA_COMMON_CUDA_CLOCK_STAMPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace strata::gpu {

// One thread writes the global timer (ns) into *slot when the stream reaches it.
cudaError_t LaunchClockStamp(uint64_t* slot, cudaStream_t stream);

class ClockStamps {
 public:
  // Appends to `path` (first line "# <who> <slots>"); each step stamps at most `slots` slots.
  static absl::StatusOr<std::unique_ptr<ClockStamps>> Open(const std::string& path,
                                                           const std::string& who, int slots);
  ~ClockStamps();

  // Queues a stamp of the global timer (ns) into `slot` on `stream`.
  absl::Status Mark(cudaStream_t stream, int slot);

  // Once the step's stamps are done (synchronizes `stream`): appends the slots stamped since
  // the last flush as one line "step slot:ns ...", and clears them. Nothing while `stream` is
  // capturing (the end of a captured step).
  absl::Status Flush(cudaStream_t stream);

 private:
  ClockStamps() = default;

  std::FILE* file_ = nullptr;
  DeviceBuffer<uint64_t> slots_;
  std::vector<uint64_t> host_;
  uint64_t step_ = 0;
};

}  // namespace strata::gpu

#endif  // STRATA_COMMON_CUDA_CLOCK_STAMPS_H_
